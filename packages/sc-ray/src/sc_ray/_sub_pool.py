"""Slices and unions of Ray resource pools: :class:`SubRayResourcePool`,
:func:`split_resource_pool` and :func:`merge_resource_pool` (verl's names).

A sub-pool runs on a contiguous range of a placed pool's bundles and shares its placement
groups; a merged pool runs on the bundles of two pools, one after the other, and shares
their placement groups (as in verl).
"""

from __future__ import annotations

from collections.abc import Sequence

from sc_core import ConfigTypeError

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


class _MergedRayResourcePool(RayResourcePool):
    """The pool :func:`merge_resource_pool` returns: a view over the bundles of its two
    parts, ``rp1``'s then ``rp2``'s, in their placement groups (verl's merged pool reuses
    the parts' placement groups the same way). Groups on it share the parts' devices with
    groups on the parts. It owns no placement group: a group on it holds a share of each part,
    so a part is released with the last group using it, directly or through the merge;
    :meth:`release` does nothing."""

    parts: tuple[RayResourcePool, RayResourcePool]

    def __init__(self, rp1: RayResourcePool, rp2: RayResourcePool) -> None:
        super().__init__(
            process_on_nodes=[*rp1.store, *rp2.store],
            use_gpu=rp1.use_gpu,
            name_prefix=f"{rp1.name_prefix}_{rp2.name_prefix}",
            max_colocate_count=rp1.max_colocate_count,
            detached=rp1.detached,
            accelerator_type=rp1.accelerator_type,
            device_name=rp1.device_name,
            num_cpus_per_process=rp1.num_cpus_per_process,
            placement_timeout_s=rp1.placement_timeout_s,
            n_gpus_per_node=rp1.n_gpus_per_node,
        )
        self.parts = (rp1, rp2)

    def get_placement_groups(
        self, strategy: str = "STRICT_PACK", name: str | None = None, device_name: str | None = None
    ) -> list[rapi.PlacementGroup]:
        """The parts' placement groups, ``rp1``'s then ``rp2``'s (each part placed first if
        needed, with ``strategy`` and ``device_name``)."""
        pgs: list[rapi.PlacementGroup] = []
        for part in self.parts:
            pgs.extend(part.get_placement_groups(strategy, None, device_name))
        self.pgs = pgs
        return pgs

    def bundle_slots(self) -> list[BundleSlot]:
        """The parts' slots, ``rp1``'s then ``rp2``'s; ``rp2``'s nodes are numbered after
        ``rp1``'s."""
        self.get_placement_groups()
        out: list[BundleSlot] = []
        offset = 0
        for part in self.parts:
            for slot in part.bundle_slots():
                out.append(
                    BundleSlot(
                        slot.placement_group,
                        slot.bundle_index,
                        slot.node_index + offset,
                        slot.local_rank,
                        slot.local_world_size,
                    )
                )
            offset += len(part.store)
        return out

    def _sc_acquire(self) -> None:
        super()._sc_acquire()
        for part in self.parts:
            part._sc_acquire()

    def _sc_release_user(self) -> None:
        super()._sc_release_user()
        for part in self.parts:
            part._sc_release_user()
        if any(part.pgs is None for part in self.parts):
            self.pgs = None

    def release(self) -> None:
        """A merged pool does not own its placement groups; they are released with its
        parts."""

    def __repr__(self) -> str:
        return f"merge_resource_pool({self.parts[0]!r}, {self.parts[1]!r})"


def merge_resource_pool(rp1: RayResourcePool, rp2: RayResourcePool) -> RayResourcePool:
    """A pool running on the bundles of ``rp1`` then ``rp2`` (verl's merge): it places both
    (if not yet) and reuses their placement groups, so a group on the merged pool shares
    each bundle's devices with groups on ``rp1`` and ``rp2`` (up to ``max_colocate_count``
    actors per bundle). Its ranks are ``rp1``'s bundles, then ``rp2``'s; either may be a
    sub-pool (:func:`split_resource_pool`).

    The pools must agree on ``use_gpu``, ``max_colocate_count``, ``n_gpus_per_node``,
    ``detached``, ``device_name`` and ``num_cpus_per_process``, and share no bundle
    (:class:`RayResourcePoolError`, a ``ValueError``, naming both values); a pool that is
    not a :class:`RayResourcePool` is a :class:`~sc_core.ConfigTypeError`. The parts are
    released with the last group using them (directly or through the merged pool); releasing
    the merged pool itself does nothing."""
    where = "merge_resource_pool"
    for label, pool in (("rp1", rp1), ("rp2", rp2)):
        if not isinstance(pool, RayResourcePool):
            raise ConfigTypeError(
                f"{where}: {label} must be a RayResourcePool, got {type(pool).__qualname__} "
                f"{pool!r}"
            )
    for label, a, b in (
        ("use_gpu", rp1.use_gpu, rp2.use_gpu),
        ("max_colocate_count", rp1.max_colocate_count, rp2.max_colocate_count),
        ("n_gpus_per_node", rp1.n_gpus_per_node, rp2.n_gpus_per_node),
        ("detached", rp1.detached, rp2.detached),
        ("device_name", rp1.device_name, rp2.device_name),
        ("num_cpus_per_process", rp1.num_cpus_per_process, rp2.num_cpus_per_process),
    ):
        if a != b:
            raise RayResourcePoolError(
                f"{where}: pools differ in {label}: rp1 has {label}={a!r}, rp2 has "
                f"{label}={b!r}; merged pools must agree on it"
            )
    if rp1 is rp2:
        raise RayResourcePoolError(
            f"{where}: rp1 and rp2 are the same pool {rp1!r}; a pool cannot be merged with itself"
        )
    merged = _MergedRayResourcePool(rp1, rp2)
    merged.get_placement_groups()
    seen = {
        (rapi.placement_group_id(slot.placement_group), slot.bundle_index)
        for slot in rp1.bundle_slots()
    }
    shared = sorted(
        index
        for index, slot in enumerate(rp2.bundle_slots())
        if (rapi.placement_group_id(slot.placement_group), slot.bundle_index) in seen
    )
    if shared:
        raise RayResourcePoolError(
            f"{where}: rp1 {rp1!r} and rp2 {rp2!r} share bundles (rp2's ranks {shared}); "
            "merge pools with distinct bundles"
        )
    return merged
