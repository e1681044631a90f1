"""The planned modes: load-balanced micro-shards and sticky routing by key.

Both return a custom mode mapping for ``@register(dispatch_mode=...)`` whose ``plan_fn``
a worker group runs; verl's ``func_generator`` hook, which only knows ``dispatch_fn`` /
``collect_fn``, gets the even split's functions, with the same result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from ._errors import DispatchArgumentError, InvalidDispatchModeError
from ._nd import (
    MeshDispatchFnDict,
    MeshModeName,
    make_nd_compute_dataproto_dispatch_fn,
    mesh_slots,
)
from ._plan import (
    Slot,
    WorkPlan,
    WorkUnit,
    balanced_plan,
    batch_length,
    check_micro_shard_size,
    rank_slots,
    take_rows,
)
from ._predefined import collect_dp_compute_data_proto, dispatch_dp_compute_data_proto
from ._protocols import DispatchWorkerGroup
from ._shard import _describe, get_shard_adapter

__all__ = [
    "KeyAffinity",
    "PlannedDispatchFnDict",
    "make_balanced_dispatch_fn",
    "make_sticky_dispatch_fn",
    "plan_balanced_proto",
]

#: Where a worker group keeps the key affinities of its sticky modes (framework state).
AFFINITY_ATTR = "_sc_key_affinities"

KeyFn = Callable[[Any], Sequence[Hashable]]


#: A planned custom mode has the mesh mode's keys: ``plan_fn`` cuts a call into units.
PlannedDispatchFnDict = MeshDispatchFnDict


def _slots(worker_group: DispatchWorkerGroup, mesh_name: str | None) -> tuple[Slot, ...]:
    return rank_slots(worker_group) if mesh_name is None else mesh_slots(worker_group, mesh_name)


def _even_fns(mesh_name: str | None) -> tuple[Callable[..., Any], Callable[..., Any]]:
    if mesh_name is None:
        return dispatch_dp_compute_data_proto, collect_dp_compute_data_proto
    nd = make_nd_compute_dataproto_dispatch_fn(mesh_name)
    return nd["dispatch_fn"], nd["collect_fn"]


def _planned_mode(
    mode: str, mesh: str | None, plan_fn: Callable[..., WorkPlan]
) -> PlannedDispatchFnDict:
    """The mapping of a scheduled mode named ``mode``: ``plan_fn``, and the even split's
    functions for worker groups that only know ``dispatch_fn`` / ``collect_fn``."""
    dispatch_fn, collect_fn = _even_fns(mesh)
    plan_fn.__name__ = plan_fn.__qualname__ = mode
    return {
        "dispatch_fn": dispatch_fn,
        "collect_fn": collect_fn,
        "name": MeshModeName(mode),
        "row_aligned": True,
        "plan_fn": plan_fn,
    }


def _check_mesh(where: str, mesh_name: object) -> str | None:
    if mesh_name is not None and (not isinstance(mesh_name, str) or not mesh_name):
        raise InvalidDispatchModeError(
            f"{where}: mesh_name must be a non-empty string or None, got {mesh_name!r}"
        )
    return mesh_name


def plan_balanced_proto(worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any) -> WorkPlan:
    """``DP_COMPUTE_PROTO_BALANCED``'s plan: 4 micro-shards per rank, pulled by free ranks."""
    mode = "DP_COMPUTE_PROTO_BALANCED"
    return balanced_plan(mode, rank_slots(worker_group), args, kwargs, None)


def make_balanced_dispatch_fn(
    micro_shard_size: int | None = None, *, mesh_name: str | None = None
) -> PlannedDispatchFnDict:
    """A load-balanced mode: the batch is cut into micro-shards of at most
    ``micro_shard_size`` rows (default: 4 per slot) that ranks pull as they become free.

    With ``mesh_name``, a slot is a dp group of that mesh: its ranks receive the same
    micro-shard and its collect rank's output is kept. The joined result is in input order,
    equal to the even split's. The method must treat rows independently (a micro-shard is a
    smaller batch), as generation and log-prob computation do; an update whose loss averages
    over the whole shard does not belong here.
    """
    where = "make_balanced_dispatch_fn"
    size = check_micro_shard_size(where, micro_shard_size)
    mesh = _check_mesh(where, mesh_name)
    label = ", ".join(x for x in (mesh, None if size is None else f"{size} rows") if x)
    mode = f"balanced_dispatch_fn[{label}]"

    def plan_fn(worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any) -> WorkPlan:
        return balanced_plan(mode, _slots(worker_group, mesh), args, kwargs, size)

    return _planned_mode(mode, mesh, plan_fn)


class KeyAffinity:
    """Which slot each session key goes to, and how many rows each slot still has to do.

    A key stays on its slot while the slot is alive and not behind: a slot is behind when
    the rows it still has to do (from unfinished calls, plus what this call gave it so far)
    exceed the least loaded live slot's by more than ``max_lag``. A new key, a key whose
    slot died and a key whose slot is behind go to the least loaded live slot. ``moves``
    counts the keys moved off a slot.
    """

    def __init__(self, slots: int, max_lag: int) -> None:
        self.routes: dict[Hashable, int] = {}
        self.outstanding = [0] * slots
        self.max_lag = max_lag
        self.moves = 0
        self._lock = threading.Lock()

    def assign(self, mode: str, keys: Sequence[Hashable], alive: Sequence[bool]) -> list[int]:
        """The slot of every row, given each row's key and which slots are alive."""
        live = [s for s, ok in enumerate(alive) if ok]
        if not live:
            raise DispatchArgumentError(f"{mode}: no live slot to route {len(keys)} rows to")
        weights: dict[Hashable, int] = {}
        for key in keys:
            try:
                weights[key] = weights.get(key, 0) + 1
            except TypeError:
                raise DispatchArgumentError(
                    f"{mode}: routing keys must be hashable, got {type(key).__qualname__} "
                    f"{_describe(key)}"
                ) from None
        with self._lock:
            loads = self.outstanding
            for key, weight in weights.items():
                slot = self.routes.get(key)
                least = min(live, key=lambda s: (loads[s], s))
                if slot is None:
                    slot = least
                elif not alive[slot] or loads[slot] - loads[least] > self.max_lag:
                    self.moves += 1
                    slot = least
                self.routes[key] = slot
                loads[slot] += weight
            return [self.routes[k] for k in keys]

    def release(self, slot: int, rows: int) -> None:
        """``rows`` rows of ``slot`` are done (or abandoned)."""
        with self._lock:
            self.outstanding[slot] = max(0, self.outstanding[slot] - rows)


def _keys_of(mode: str, batch: Any, key: str | KeyFn) -> list[Hashable]:
    if callable(key):
        keys = list(key(batch))
    else:
        columns = getattr(batch, "non_tensor_batch", None)
        if isinstance(columns, Mapping):
            if key not in columns:
                raise DispatchArgumentError(
                    f"{mode}: the batch has no non-tensor column {key!r} to route by "
                    f"(columns: {sorted(columns)})"
                )
            keys = list(columns[key])
        elif isinstance(batch, Sequence) and all(isinstance(r, Mapping) for r in batch):
            missing = [i for i, r in enumerate(batch) if key not in r]
            if missing:
                raise DispatchArgumentError(
                    f"{mode}: rows {missing[:8]} have no key {key!r} to route by"
                )
            keys = [r[key] for r in batch]
        else:
            raise DispatchArgumentError(
                f"{mode}: cannot read the routing key {key!r} from {type(batch).__qualname__} "
                "(a DataProto non-tensor column, or Rows of mappings); pass key=callable"
            )
    return keys


class _AffinityOwner:
    """The identity of one sticky mode (one :func:`make_sticky_dispatch_fn` call): a worker
    group keeps one :class:`KeyAffinity` per mode, so two modes routing by the same column
    keep their own routes and ``max_lag``; the methods registered with one mode share it."""

    __slots__ = ("mode",)

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __repr__(self) -> str:
        return f"<key affinity of {self.mode}>"


def _affinity(worker_group: Any, owner: _AffinityOwner, slots: int, max_lag: int) -> KeyAffinity:
    affinities: dict[_AffinityOwner, KeyAffinity] | None = getattr(
        worker_group, AFFINITY_ATTR, None
    )
    if affinities is None:
        affinities = {}
        setattr(worker_group, AFFINITY_ATTR, affinities)
    affinity = affinities.get(owner)
    if affinity is None or len(affinity.outstanding) != slots:
        affinity = affinities[owner] = KeyAffinity(slots, max_lag)
    return affinity


def make_sticky_dispatch_fn(
    key: str | KeyFn = "session_id", *, mesh_name: str | None = None, max_lag: int = 16
) -> PlannedDispatchFnDict:
    """A mode that routes rows with the same session key to the same rank (multi-turn
    agents keep their state, a KV cache, where it is).

    ``key`` is a non-tensor column of the DataProto (or a key of each row of
    ``sc_dispatch.Rows`` of mappings), or a function of the batch that returns one key per
    row. The worker group keeps a :class:`KeyAffinity` per mode (per call of this function:
    two modes on one column route on their own, with their own ``max_lag``; methods
    registered with the same mode share its routes): a key moves only when its
    rank died (known to the group) or has more than ``max_lag`` rows left to do beyond the
    least loaded rank. With ``mesh_name`` the routing is per dp group of that mesh. The
    joined result is in input order; a rank that got no rows is not called.
    """
    where = "make_sticky_dispatch_fn"
    if not callable(key) and (not isinstance(key, str) or not key):
        raise InvalidDispatchModeError(
            f"{where}: key must be a column name or a function of the batch, got {key!r}"
        )
    if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0:
        raise InvalidDispatchModeError(
            f"{where}: max_lag must be a non-negative int (rows), got {max_lag!r}"
        )
    mesh = _check_mesh(where, mesh_name)
    key_label = key if isinstance(key, str) else getattr(key, "__name__", "key_fn")
    mode = f"sticky_dispatch_fn[{key_label}{'' if mesh is None else f', {mesh}'}]"
    owner = _AffinityOwner(mode)

    def plan_fn(worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any) -> WorkPlan:
        slots = _slots(worker_group, mesh)
        length = batch_length(mode, args, kwargs)
        if length == 0:
            raise DispatchArgumentError(f"{mode}: cannot route an empty batch (0 rows)")
        first = next(v for v in (*args, *kwargs.values()) if get_shard_adapter(v) is not None)
        keys = _keys_of(mode, first, key)
        if len(keys) != length:
            raise DispatchArgumentError(
                f"{mode}: got {len(keys)} routing keys for a batch of {length} rows"
            )
        dead = set(getattr(worker_group, "dead_ranks", ()) or ())
        alive = [not dead.intersection(s.ranks) for s in slots]
        affinity = _affinity(worker_group, owner, len(slots), max_lag)
        assigned = affinity.assign(mode, keys, alive)
        by_slot = [[i for i, s in enumerate(assigned) if s == slot] for slot in range(len(slots))]
        units: list[WorkUnit] = []
        try:
            for slot, rows in enumerate(by_slot):
                if not rows:
                    continue
                unit_args = tuple(take_rows(mode, a, rows) for a in args)
                unit_kwargs = {k: take_rows(mode, v, rows) for k, v in kwargs.items()}
                units.append(WorkUnit(len(units), tuple(rows), unit_args, unit_kwargs, slot=slot))
        except BaseException:  # nothing will run: the rows are no one's to do
            for slot, rows in enumerate(by_slot):
                affinity.release(slot, len(rows))
            raise

        def release(unit: WorkUnit) -> None:
            if unit.slot is not None:
                affinity.release(unit.slot, len(unit.rows))

        return WorkPlan(mode, slots, tuple(units), length, release)

    return _planned_mode(mode, mesh, plan_fn)
