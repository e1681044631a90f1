"""Slices and unions of Ray resource pools: :class:`SubRayResourcePool`,
:func:`split_resource_pool` and :func:`merge_resource_pool` (verl's names).

A sub-pool runs on a contiguous range of a placed pool's bundles and shares its placement
groups; a merged pool is a new, unplaced pool with the nodes of two unplaced ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import _ray_api as rapi
from ._errors import RayResourcePoolError
from ._resource_pool import BundleSlot, RayResourcePool

__all__ = ["SubRayResourcePool", "merge_resource_pool", "split_resource_pool"]


class SubRayResourcePool(RayResourcePool):
    """A contiguous slice of a placed pool's bundles (see :func:`split_resource_pool`).

    It shares the placement groups of the root pool (the pool that was split first, also
    when a sub-pool is split again): ranks ``0..subgroup_world_size-1`` run on the root's
    bundles ``start_bundle_index ..`` (an index into the root's flat bundle order, as in
    verl). Releasing a sub-pool does nothing: release the root.
    """

    parent: RayResourcePool
    start_bundle_index: int

    def __init__(
        self,
        placement_groups: Sequence[rapi.PlacementGroup],
        start_bundle_index: int,
        subgroup_world_size: int,
        parent: RayResourcePool,
    ) -> None:
        if isinstance(parent, SubRayResourcePool):
            start_bundle_index += parent.start_bundle_index
            parent = parent.parent
        super().__init__(
            process_on_nodes=None,
            use_gpu=parent.use_gpu,
            name_prefix=parent.name_prefix,
            max_colocate_count=parent.max_colocate_count,
            detached=parent.detached,
            accelerator_type=parent.accelerator_type,
            device_name=parent.device_name,
            num_cpus_per_process=parent.num_cpus_per_process,
            placement_timeout_s=parent.placement_timeout_s,
            n_gpus_per_node=parent.n_gpus_per_node,
        )
        self.parent = parent
        self.pgs = list(placement_groups)
        self.start_bundle_index = start_bundle_index
        self.subgroup_world_size = subgroup_world_size
        end = start_bundle_index + subgroup_world_size
        self._slots = parent.bundle_slots()[start_bundle_index:end]
        per_node: dict[int, int] = {}
        for slot in self._slots:
            per_node[slot.node_index] = per_node.get(slot.node_index, 0) + 1
        self._store = [per_node[k] for k in sorted(per_node)]

    @property
    def world_size(self) -> int:
        return self.subgroup_world_size

    def get_placement_groups(
        self, strategy: str = "STRICT_PACK", name: str | None = None, device_name: str | None = None
    ) -> list[rapi.PlacementGroup]:
        return list(self.pgs or [])

    def bundle_slots(self) -> list[BundleSlot]:
        out: list[BundleSlot] = []
        seen: dict[int, int] = {}
        counts: dict[int, int] = {}
        for slot in self._slots:
            counts[slot.node_index] = counts.get(slot.node_index, 0) + 1
        node_order = {n: i for i, n in enumerate(sorted(counts))}
        for slot in self._slots:
            local = seen.get(slot.node_index, 0)
            seen[slot.node_index] = local + 1
            out.append(
                BundleSlot(
                    slot.placement_group,
                    slot.bundle_index,
                    node_order[slot.node_index],
                    local,
                    counts[slot.node_index],
                )
            )
        return out

    def release(self) -> None:
        """A sub-pool does not own its placement groups; release the parent pool."""


def split_resource_pool(
    resource_pool: RayResourcePool, split_size: int | Sequence[int]
) -> list[SubRayResourcePool]:
    """Split a pool into consecutive sub-pools of ``split_size`` ranks each (an int: equal
    parts; a list: those sizes, which must add up to the pool's world size)."""
    world = resource_pool.world_size
    if isinstance(split_size, int):
        if isinstance(split_size, bool) or split_size < 1 or world % split_size:
            raise RayResourcePoolError(
                f"split_resource_pool: split_size {split_size} must divide the pool's world "
                f"size {world} (process_on_nodes={resource_pool.store})"
            )
        sizes = [split_size] * (world // split_size)
    else:
        sizes = list(split_size)
        if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes) or sum(sizes) != world:
            raise RayResourcePoolError(
                f"split_resource_pool: sizes {sizes} must be positive and add up to the pool's "
                f"world size {world} (process_on_nodes={resource_pool.store})"
            )
    pgs = resource_pool.get_placement_groups()
    out: list[SubRayResourcePool] = []
    start = 0
    for size in sizes:
        out.append(SubRayResourcePool(pgs, start, size, resource_pool))
        start += size
    return out


def merge_resource_pool(rp1: RayResourcePool, rp2: RayResourcePool) -> RayResourcePool:
    """A new, unplaced pool with the nodes of ``rp1`` then ``rp2``; both must be unplaced and
    agree on ``use_gpu``, ``max_colocate_count``, device and CPUs per process."""
    for label, a, b in (
        ("use_gpu", rp1.use_gpu, rp2.use_gpu),
        ("max_colocate_count", rp1.max_colocate_count, rp2.max_colocate_count),
        ("device_name", rp1.device_name, rp2.device_name),
        ("num_cpus_per_process", rp1.num_cpus_per_process, rp2.num_cpus_per_process),
        ("detached", rp1.detached, rp2.detached),
    ):
        if a != b:
            raise RayResourcePoolError(
                f"merge_resource_pool: pools differ in {label}: {a!r} vs {b!r}"
            )
    if rp1.pgs is not None or rp2.pgs is not None:
        raise RayResourcePoolError(
            f"merge_resource_pool: both pools must be unplaced, got {rp1!r} and {rp2!r}"
        )
    return RayResourcePool(
        process_on_nodes=[*rp1.store, *rp2.store],
        use_gpu=rp1.use_gpu,
        name_prefix=rp1.name_prefix if rp1._name_prefix_given else None,
        max_colocate_count=rp1.max_colocate_count,
        detached=rp1.detached,
        accelerator_type=rp1.accelerator_type,
        device_name=rp1.device_name,
        num_cpus_per_process=rp1.num_cpus_per_process,
        placement_timeout_s=rp1.placement_timeout_s,
        n_gpus_per_node=rp1.n_gpus_per_node,
    )
