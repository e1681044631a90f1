"""Ray resource pools: one placement group per node, ordered by node IP.

A pool describes how many worker processes run on each node (``process_on_nodes``). Placing
it reserves one placement group per node, one bundle per process. Ranks follow the flat
bundle order: node by node (sorted by IP), bundle by bundle, so that rank <-> node stays the
same when a pool is re-created on the same nodes.
"""

from __future__ import annotations

import ipaddress
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sc_core import ResourcePool, UnknownRoleError

from . import _ray_api as rapi
from ._errors import InsufficientResourcesError, PlacementTimeoutError, RayResourcePoolError
from ._settings import PLACEMENT_TIMEOUT

__all__ = [
    "DEFAULT_PLACEMENT_TIMEOUT_S",
    "PLACEMENT_TIMEOUT_ENV",
    "BundleSlot",
    "RayResourcePool",
    "ResourcePoolManager",
    "SubRayResourcePool",
    "merge_resource_pool",
    "sort_placement_group_by_node_ip",
    "split_resource_pool",
]

logger = logging.getLogger("sc_ray")

#: The variable giving the seconds to wait for a pool's placement groups when the pool does
#: not say, and its default (both from :data:`sc_ray._settings.PLACEMENT_TIMEOUT`).
PLACEMENT_TIMEOUT_ENV = PLACEMENT_TIMEOUT.name
DEFAULT_PLACEMENT_TIMEOUT_S = PLACEMENT_TIMEOUT.default

_DEVICE_RESOURCE = {"cuda": "GPU", "gpu": "GPU", "npu": "NPU"}


def _ip_key(ip: str) -> tuple[int, int, str]:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return (9, 0, ip)
    return (addr.version, int(addr), ip)


def sort_placement_group_by_node_ip(
    pgs: Sequence[rapi.PlacementGroup],
) -> list[rapi.PlacementGroup]:
    """Ready placement groups, ordered by the IP (then node id) of their first bundle's node.

    Ordering by node keeps rank <-> node stable when a pool is re-created on the same nodes
    (Ray hands out placement groups in no particular node order).
    """
    nodes = {n.node_id: n for n in rapi.list_nodes()}

    def key(pg: rapi.PlacementGroup) -> tuple[tuple[int, int, str], str]:
        bundle_nodes = rapi.placement_group_bundle_nodes(pg)
        node_id = bundle_nodes[0] if bundle_nodes else ""
        node = nodes.get(node_id)
        return (_ip_key(node.ip if node else ""), node_id)

    return sorted(pgs, key=key)


@dataclass(frozen=True)
class BundleSlot:
    """Where one rank of a pool runs: bundle ``bundle_index`` of ``placement_group``.

    ``local_rank`` / ``local_world_size`` count the ranks of the same pool on the same
    placement group (node).
    """

    placement_group: rapi.PlacementGroup
    bundle_index: int
    node_index: int
    local_rank: int
    local_world_size: int


def _check_counts(process_on_nodes: Sequence[int]) -> list[int]:
    counts = list(process_on_nodes)
    bad = [c for c in counts if isinstance(c, bool) or not isinstance(c, int) or c < 1]
    if not counts or bad:
        raise RayResourcePoolError(
            f"process_on_nodes must be a non-empty list of positive process counts per node, "
            f"got {list(process_on_nodes)!r}"
        )
    return counts


class RayResourcePool(ResourcePool):
    """Worker processes per node, reserved as one placement group per node.

    ``process_on_nodes[i]`` processes run on node ``i``; each gets one bundle. A GPU pool
    (``use_gpu=True``) puts one accelerator (``device_name`` ``"cuda"`` -> ``GPU``, ``"npu"``
    -> ``NPU``) and ``num_cpus_per_process`` CPUs in each bundle; a CPU pool puts only the
    CPUs, so it reserves what its workers use and runs on CPU-only clusters. Up to
    ``max_colocate_count`` actors (of different worker groups) share one bundle, each asking
    ``1 / max_colocate_count`` of its resources. ``accelerator_type`` adds a tiny demand for
    Ray's ``accelerator_type:<X>`` resource so bundles land on that hardware.

    Placement happens on first use (:meth:`get_placement_groups`). A pool that asks more
    than the whole cluster has fails at once with :class:`InsufficientResourcesError`
    (``check_capacity=False`` skips that check, for clusters with an autoscaler); one the
    cluster could hold later fails with :class:`PlacementTimeoutError` after
    ``placement_timeout_s`` (default ``$SC_RAY_PLACEMENT_TIMEOUT_S`` or 300 s) instead of
    waiting forever; the groups it made are removed first, so a retry starts clean.
    :meth:`release` removes the groups.
    """

    def __init__(
        self,
        process_on_nodes: Sequence[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        accelerator_type: str | None = None,
        *,
        device_name: str = "cuda",
        num_cpus_per_process: float = 1.0,
        placement_timeout_s: float | None = None,
        n_gpus_per_node: int = 8,
        check_capacity: bool = True,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count, n_gpus_per_node)
        if device_name.lower() not in _DEVICE_RESOURCE:
            raise RayResourcePoolError(
                f"device_name must be one of {sorted(_DEVICE_RESOURCE)}, got {device_name!r}"
            )
        if not num_cpus_per_process > 0:
            raise RayResourcePoolError(
                f"num_cpus_per_process must be positive, got {num_cpus_per_process!r}"
            )
        if placement_timeout_s is not None and not placement_timeout_s > 0:
            raise RayResourcePoolError(
                f"placement_timeout_s must be positive, got {placement_timeout_s!r}"
            )
        self.use_gpu = bool(use_gpu)
        self._name_prefix_given = name_prefix is not None
        self.name_prefix = name_prefix if name_prefix is not None else uuid.uuid4().hex[:8] + "_"
        self.detached = bool(detached)
        self.accelerator_type = accelerator_type
        self.device_name = device_name.lower()
        self.num_cpus_per_process = float(num_cpus_per_process)
        self.placement_timeout_s = placement_timeout_s
        self.check_capacity = bool(check_capacity)
        self.pgs: list[rapi.PlacementGroup] | None = None
        self._sc_users = 0

    def add_node(self, process_count: int) -> None:
        """Append a node running ``process_count`` processes (before placement only)."""
        if self.pgs is not None:
            raise RayResourcePoolError(
                f"add_node({process_count!r}): the pool is already placed on {self._store}"
            )
        super().add_node(process_count)

    # -- resources ---------------------------------------------------------------------------

    @property
    def device_resource(self) -> str:
        """Ray's resource name for this pool's accelerator (``GPU`` or ``NPU``)."""
        return _DEVICE_RESOURCE[self.device_name]

    def bundle(self) -> dict[str, float]:
        """The resources one process's bundle reserves."""
        out: dict[str, float] = {"CPU": self.num_cpus_per_process}
        if self.use_gpu:
            out[self.device_resource] = 1.0
            if self.accelerator_type:
                out[self.accelerator_type] = 1e-4
        return out

    def actor_resources(self) -> dict[str, float]:
        """What one actor asks of its bundle: a ``1 / max_colocate_count`` share of each."""
        share = 1.0 / self.max_colocate_count
        out = {"num_cpus": self.num_cpus_per_process * share}
        if self.use_gpu:
            out["num_gpus" if self.device_resource == "GPU" else self.device_resource] = share
        return out

    def _pg_names(self, name: str | None) -> list[str]:
        counts = "_".join(str(c) for c in self._store)
        base = name if name else f"{self.name_prefix}sc_group_{counts}:"
        return [f"{base}{idx}" for idx in range(len(self._store))]

    def get_placement_groups(
        self, strategy: str = "STRICT_PACK", name: str | None = None, device_name: str | None = None
    ) -> list[rapi.PlacementGroup]:
        """Reserve (once) and return the pool's placement groups, ordered by node IP."""
        if self.pgs is not None:
            return self.pgs
        if not self._store:
            raise RayResourcePoolError("the resource pool has no nodes; give process_on_nodes")
        if device_name is not None and device_name.lower() != self.device_name:
            if device_name.lower() not in _DEVICE_RESOURCE:
                raise RayResourcePoolError(
                    f"device_name must be one of {sorted(_DEVICE_RESOURCE)}, got {device_name!r}"
                )
            self.device_name = device_name.lower()
        if strategy not in ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD"):
            raise RayResourcePoolError(f"unknown placement strategy {strategy!r}")
        names = self._pg_names(name)
        taken = [n for n in names if rapi.get_placement_group(n) is not None]
        if taken:
            raise RayResourcePoolError(
                f"placement group name(s) {taken} already exist in this Ray namespace; give the "
                "pool a distinct name_prefix or release the other pool"
            )
        bundle = self.bundle()
        self._check_capacity(bundle, strategy)
        lifetime = "detached" if self.detached else None
        timeout = (
            self.placement_timeout_s
            if self.placement_timeout_s is not None
            else PLACEMENT_TIMEOUT.get()
        )
        created: list[rapi.PlacementGroup] = []
        try:
            for pg_name, count in zip(names, self._store, strict=True):
                created.append(
                    rapi.create_placement_group([bundle] * count, strategy, pg_name, lifetime)
                )
            deadline = rapi.monotonic() + timeout
            for pg, count in zip(created, self._store, strict=True):
                left = max(0.0, deadline - rapi.monotonic())
                if not rapi.wait_placement_group(pg, left):
                    raise PlacementTimeoutError(self._placement_message(bundle, count, timeout))
        except BaseException as exc:
            for pg in created:
                rapi.remove_placement_group(pg)
            if isinstance(exc, (RayResourcePoolError, PlacementTimeoutError)):
                raise
            if isinstance(exc, Exception):
                raise RayResourcePoolError(
                    f"placing pool {self._store} with bundles {bundle} failed: {exc}"
                ) from exc
            raise
        self.pgs = sort_placement_group_by_node_ip(created)
        logger.debug("placed pool %s as %s", self._store, names)
        return self.pgs

    def _check_capacity(self, bundle: Mapping[str, float], strategy: str) -> None:
        """Fail at once when the cluster could never hold the pool: more of a resource than
        all alive nodes together have, or (``STRICT_PACK``: one placement group per node)
        one node's share larger than any node. A request the cluster could satisfy once
        other pools are released waits for the placement deadline instead."""
        if not self.check_capacity:
            return
        nodes = [n for n in rapi.list_nodes() if n.alive]
        totals: dict[str, float] = {}
        for node in nodes:
            for key, amount in node.resources.items():
                totals[key] = totals.get(key, 0.0) + amount
        asked = self._total()
        short = {k: v for k, v in asked.items() if v > totals.get(k, 0.0) + 1e-9}
        if short:
            raise InsufficientResourcesError(
                f"pool process_on_nodes={self._store} asks {_fmt(asked)} in all "
                f"({_fmt(bundle)} per process), more than the whole cluster has: "
                f"{_fmt(totals)} on {len(nodes)} node(s); it could never be placed. "
                "Ask for fewer processes, or add nodes (with an autoscaler, pass "
                "check_capacity=False)"
            )
        if strategy != "STRICT_PACK":
            return
        for count in self._store:
            for key, per_process in bundle.items():
                need = per_process * count
                best = max((n.resources.get(key, 0.0) for n in nodes), default=0.0)
                if need > best + 1e-9:
                    raise InsufficientResourcesError(
                        f"pool process_on_nodes={self._store} puts {count} processes on one "
                        f"node, asking {key}={need:g} there, but the largest node has "
                        f"{key}={best:g}; it could never be placed. Spread the processes "
                        "over more nodes (process_on_nodes), or use bin_pack=False"
                    )

    def _placement_message(self, bundle: Mapping[str, float], count: int, timeout: float) -> str:
        nodes = [n for n in rapi.list_nodes() if n.alive]
        per_node = "; ".join(f"{n.ip} ({n.node_id[:8]}): {_fmt(n.resources)}" for n in nodes)
        return (
            f"the cluster did not reserve pool process_on_nodes={self._store} within "
            f"{timeout:g} s: asked one placement group per node of {count} bundle(s) "
            f"{_fmt(bundle)} each (total {_fmt(self._total())}); the cluster has "
            f"{_fmt(rapi.cluster_resources())} in all, {_fmt(rapi.available_resources())} "
            f"free, on {len(nodes)} node(s): {per_node}"
        )

    def _total(self) -> dict[str, float]:
        return {k: v * self.world_size for k, v in self.bundle().items()}

    def bundle_slots(self) -> list[BundleSlot]:
        """One slot per rank, in rank order (places the pool if needed)."""
        pgs = self.get_placement_groups()
        slots: list[BundleSlot] = []
        for node_index, pg in enumerate(pgs):
            n = len(rapi.placement_group_bundles(pg))
            slots.extend(BundleSlot(pg, b, node_index, b, n) for b in range(n))
        return slots

    def _sc_acquire(self) -> None:
        """A worker group starts using the pool."""
        self._sc_users += 1

    def _sc_release_user(self) -> None:
        """A worker group stopped using the pool; the last one releases it."""
        self._sc_users = max(0, self._sc_users - 1)
        if self._sc_users == 0:
            self.release()

    def release(self) -> None:
        """Remove the pool's placement groups (killing whatever still runs in them)."""
        pgs, self.pgs = self.pgs, None
        for pg in pgs or []:
            rapi.remove_placement_group(pg)

    def __repr__(self) -> str:
        kind = self.device_resource if self.use_gpu else "CPU"
        return (
            f"{type(self).__name__}(process_on_nodes={self._store}, {kind}, "
            f"max_colocate_count={self.max_colocate_count}, placed={self.pgs is not None})"
        )


def _fmt(resources: Mapping[str, float]) -> str:
    keep = {
        k: v
        for k, v in resources.items()
        if not k.startswith("node:") and "memory" not in k and "_group_" not in k
    }
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(keep.items())) + "}"


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


class ResourcePoolManager:
    """Named pools and the roles that use them (verl's trainer-side helper).

    ``resource_pool_spec`` maps a pool name to processes per node (``{"global_pool": [8,
    8]}``); ``mapping`` maps a role to a pool name. :meth:`create_resource_pool` first checks
    the cluster has the accelerators (or CPUs, with ``use_gpu=False``) the pools ask for.
    """

    def __init__(
        self,
        resource_pool_spec: Mapping[str, Sequence[int]],
        mapping: Mapping[Any, str],
        *,
        use_gpu: bool = True,
        max_colocate_count: int = 1,
        device_name: str = "cuda",
        placement_timeout_s: float | None = None,
    ) -> None:
        unknown = sorted({str(p) for p in mapping.values() if p not in resource_pool_spec})
        if unknown:
            raise RayResourcePoolError(
                f"ResourcePoolManager: mapping names pools {unknown} that resource_pool_spec "
                f"does not define (defined: {sorted(resource_pool_spec)})"
            )
        self.resource_pool_spec = {k: _check_counts(v) for k, v in resource_pool_spec.items()}
        self.mapping = dict(mapping)
        self.use_gpu = use_gpu
        self.max_colocate_count = max_colocate_count
        self.device_name = device_name
        self.placement_timeout_s = placement_timeout_s
        self.resource_pool_dict: dict[str, RayResourcePool] = {}

    def create_resource_pool(self) -> None:
        """Check the cluster's capacity, then create (not yet place) every pool."""
        self._check_resource_available()
        for name, counts in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = RayResourcePool(
                process_on_nodes=counts,
                use_gpu=self.use_gpu,
                max_colocate_count=self.max_colocate_count,
                name_prefix=f"{name}_{uuid.uuid4().hex[:6]}_",
                device_name=self.device_name,
                placement_timeout_s=self.placement_timeout_s,
            )

    def get_resource_pool(self, role: Any) -> RayResourcePool:
        """The pool that ``role`` runs on."""
        if role not in self.mapping:
            raise UnknownRoleError(
                f"ResourcePoolManager.get_resource_pool: role {role!r} has no pool (mapped "
                f"roles: {sorted(map(str, self.mapping))})"
            )
        name = self.mapping[role]
        if name not in self.resource_pool_dict:
            raise RayResourcePoolError(
                f"ResourcePoolManager: pool {name!r} is not created yet; call create_resource_pool"
            )
        return self.resource_pool_dict[name]

    def get_n_gpus(self) -> int:
        """The number of processes (one accelerator each) over all pools."""
        return sum(sum(counts) for counts in self.resource_pool_spec.values())

    def _check_resource_available(self) -> None:
        resource = _DEVICE_RESOURCE.get(self.device_name.lower(), "GPU") if self.use_gpu else "CPU"
        per_node = sorted(
            (n.resources.get(resource, 0.0) for n in rapi.list_nodes() if n.alive), reverse=True
        )
        total_have = sum(per_node)
        need = self.get_n_gpus()
        if total_have < need:
            raise RayResourcePoolError(
                f"ResourcePoolManager: pools {self.resource_pool_spec} ask {need} {resource} "
                f"in all, the cluster has {total_have:g} (per node: {per_node})"
            )
        # Each pool's per-node counts must fit some node; check greedily, largest first.
        free = list(per_node)
        for name, counts in self.resource_pool_spec.items():
            for count in sorted(counts, reverse=True):
                free.sort(reverse=True)
                if not free or free[0] < count:
                    raise RayResourcePoolError(
                        f"ResourcePoolManager: pool {name!r} needs {count} {resource} on one "
                        f"node; the nodes have {per_node} (free after other pools: {free})"
                    )
                free[0] -= count

    def release(self) -> None:
        """Release every pool's placement groups."""
        for pool in self.resource_pool_dict.values():
            pool.release()
