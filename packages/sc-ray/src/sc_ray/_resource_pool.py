"""Ray resource pools: one placement group per node, ordered by node IP.

A pool describes how many worker processes run on each node (``process_on_nodes``). Placing
it reserves one placement group per node, one bundle per process. Ranks follow the flat
bundle order: node by node (sorted by IP), bundle by bundle, so that rank <-> node stays the
same when a pool is re-created on the same nodes.
"""

from __future__ import annotations

import ipaddress
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sc_core import ResourcePool

from . import _ray_api as rapi
from ._errors import (
    InsufficientResourcesError,
    PlacementTimeoutError,
    RankPlacementTimeoutError,
    RayResourcePoolError,
)
from ._settings import PLACEMENT_TIMEOUT

__all__ = [
    "DEFAULT_PLACEMENT_TIMEOUT_S",
    "DEVICE_NAMES",
    "DEVICE_RESOURCE",
    "PLACEMENT_TIMEOUT_ENV",
    "BundleSlot",
    "RayResourcePool",
    "check_device_name",
    "sort_placement_group_by_node_ip",
]

logger = logging.getLogger("sc_ray")

#: The variable giving the seconds to wait for a pool's placement groups when the pool does
#: not say, and its default (both from :data:`sc_ray._settings.PLACEMENT_TIMEOUT`).
PLACEMENT_TIMEOUT_ENV = PLACEMENT_TIMEOUT.name
DEFAULT_PLACEMENT_TIMEOUT_S = PLACEMENT_TIMEOUT.default

#: How often :meth:`RayResourcePool.wait_ranks_placed` asks Ray where the bundles are.
_PLACED_POLL_S = 0.2

#: Ray's resource name for each accelerator name a pool accepts.
DEVICE_RESOURCE = {"cuda": "GPU", "gpu": "GPU", "npu": "NPU"}

#: Every device name a pool and a worker group accept: the accelerators, and ``"cpu"``
#: (what verl's ``get_device_name()`` returns without CUDA), valid with ``use_gpu=False`` only.
DEVICE_NAMES = (*DEVICE_RESOURCE, "cpu")


def check_device_name(where: str, device_name: object, use_gpu: bool) -> str:
    """``device_name`` lower-cased, refused (:class:`RayResourcePoolError`, a ``ValueError``)
    unless it is one of :data:`DEVICE_NAMES`, or when it is ``"cpu"`` for a pool with
    ``use_gpu=True`` (a GPU pool needs an accelerator to reserve)."""
    if not isinstance(device_name, str) or device_name.lower() not in DEVICE_NAMES:
        raise RayResourcePoolError(
            f"{where}: device_name must be one of {sorted(DEVICE_NAMES)}, got "
            f"{type(device_name).__qualname__} {device_name!r}"
        )
    name = device_name.lower()
    if name == "cpu" and use_gpu:
        raise RayResourcePoolError(
            f"{where}: device_name='cpu' with use_gpu=True: a pool with use_gpu=True reserves "
            f"one accelerator per process, named by device_name (one of "
            f"{sorted(DEVICE_RESOURCE)}); pass use_gpu=False for a CPU pool"
        )
    return name


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


class RayResourcePool(ResourcePool):
    """Worker processes per node, reserved as one placement group per node.

    ``process_on_nodes[i]`` processes run on node ``i``; each gets one bundle. A GPU pool
    (``use_gpu=True``) puts one accelerator (``device_name`` ``"cuda"`` -> ``GPU``, ``"npu"``
    -> ``NPU``) and ``num_cpus_per_process`` CPUs in each bundle; a CPU pool
    (``use_gpu=False``, any device name, ``"cpu"`` included) puts only the CPUs, so it
    reserves what its workers use and runs on CPU-only clusters. ``device_name="cpu"`` with
    ``use_gpu=True``, or an unknown device name, is a :class:`RayResourcePoolError`. Up to
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
        device_name = check_device_name("RayResourcePool", device_name, bool(use_gpu))
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
        self.device_name = device_name
        self.num_cpus_per_process = float(num_cpus_per_process)
        self.placement_timeout_s = placement_timeout_s
        self.check_capacity = bool(check_capacity)
        self.pgs: list[rapi.PlacementGroup] | None = None

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
        """Ray's resource name for this pool's accelerator (``GPU`` or ``NPU``; ``CPU`` for
        ``device_name="cpu"``, which only a pool with ``use_gpu=False`` has)."""
        return DEVICE_RESOURCE.get(self.device_name, "CPU")

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
        if device_name is not None:
            where = "RayResourcePool.get_placement_groups"
            self.device_name = check_device_name(where, device_name, self.use_gpu)
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
        timeout = self.resolved_placement_timeout()
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

    def resolved_placement_timeout(self) -> float:
        """The seconds a placement of this pool may take: ``placement_timeout_s``, else
        ``$SC_RAY_PLACEMENT_TIMEOUT_S``, else 300."""
        if self.placement_timeout_s is not None:
            return self.placement_timeout_s
        return PLACEMENT_TIMEOUT.get()

    def unplaced_ranks(self, ranks: Sequence[int]) -> list[int]:
        """The ranks among ``ranks`` whose bundle is not reserved on a live node now: its
        node was lost and Ray has not placed the placement group again (it does so as soon
        as a live node has the room)."""
        slots = self.bundle_slots()
        alive = {n.node_id for n in rapi.list_nodes() if n.alive}
        seen: dict[str, tuple[str, dict[int, str]]] = {}
        out: list[int] = []
        for rank in ranks:
            slot = slots[rank]
            key = rapi.placement_group_id(slot.placement_group)
            if key not in seen:
                pg = slot.placement_group
                seen[key] = (
                    rapi.placement_group_state(pg),
                    rapi.placement_group_bundle_node_map(pg),
                )
            state, nodes = seen[key]
            if state != "CREATED" or nodes.get(slot.bundle_index) not in alive:
                out.append(rank)
        return out

    def wait_ranks_placed(self, ranks: Sequence[int], *, where: str, group: str) -> None:
        """Wait until the bundles of ``ranks`` are reserved on live nodes (at once, unless
        their node was lost), up to the pool's placement deadline
        (:meth:`resolved_placement_timeout`); then :class:`RankPlacementTimeoutError` names
        the group, the ranks and the resources no live node has free. ``where`` names the
        caller in the message."""
        timeout = self.resolved_placement_timeout()
        deadline = rapi.monotonic() + timeout
        waiting = self.unplaced_ranks(ranks)
        if waiting:
            logger.warning(
                "%s: the bundles of ranks %s lost their node; waiting up to %g s for Ray to "
                "place them again on a live node",
                where,
                waiting,
                timeout,
            )
        while waiting:
            if rapi.monotonic() >= deadline:
                raise self._rank_placement_error(where, group, waiting, timeout)
            time.sleep(_PLACED_POLL_S)
            waiting = self.unplaced_ranks(waiting)

    def _rank_placement_error(
        self, where: str, group: str, ranks: list[int], timeout: float
    ) -> RankPlacementTimeoutError:
        slots = self.bundle_slots()
        bundle = self.bundle()
        # a node's placement group moves whole (STRICT_PACK): one live node needs room for
        # all its bundles; the largest such demand among the lost groups
        per_group: dict[str, int] = {}
        for rank in ranks:
            key = rapi.placement_group_id(slots[rank].placement_group)
            per_group[key] = slots[rank].local_world_size
        count = max(per_group.values())
        need = {k: v * count for k, v in bundle.items()}
        free = rapi.available_resources()
        missing = {k: v - free.get(k, 0.0) for k, v in need.items() if v > free.get(k, 0.0) + 1e-9}
        where_ranks = ", ".join(
            f"rank {r} (bundle {slots[r].bundle_index} of node {slots[r].node_index} of pool "
            f"{self._store})"
            for r in ranks
        )
        nodes = [n for n in rapi.list_nodes() if n.alive]
        per_node = "; ".join(f"{n.ip} ({n.node_id[:8]}): {_fmt(n.resources)}" for n in nodes)
        short = (
            f"missing {_fmt(missing)}: no live node has that free"
            if missing
            else "the cluster has that much free in all, but Ray did not place it on one node"
        )
        message = (
            f"{where}: group {group!r} cannot start {where_ranks} again: its node was lost and "
            f"Ray did not place the bundle again on a live node within {timeout:g} s. Its "
            f"node's placement group asks {_fmt(need)} on one node ({count} bundle(s) of "
            f"{_fmt(bundle)}); {short}. The cluster has {_fmt(rapi.cluster_resources())} in "
            f"all, {_fmt(free)} free, on {len(nodes)} live node(s): {per_node}. Add a node "
            "with that room or free it (the pool's placement_timeout_s, else "
            f"{PLACEMENT_TIMEOUT.name}, sets the wait)"
        )
        return RankPlacementTimeoutError(
            message, group=group, ranks=ranks, asked=bundle, missing=missing, timeout_s=timeout
        )

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
