"""Work plans: a call cut into units of rows that a worker group schedules one by one.

A plain splitting mode sends every rank one shard up front and joins the shards when all are
done. A *planned* call instead describes its work as a :class:`WorkPlan`:

* **slots** -- the groups of ranks that take work together (one rank each for
  ``DP_COMPUTE_PROTO``; every dp group of a mesh for the N-d modes: all its ranks receive the
  same unit and the output of its collect rank is kept);
* **units** -- pieces of the batch (arguments already cut), each naming the input rows its
  output holds, and the slot it is pinned to (``None``: whichever slot is free first).

The worker group (sc-core) starts units on free slots and hands each finished unit's output
back as it arrives: that is how a call is *streamed* (``proxy.stream(...)``), how the
load-balanced mode lets ranks pull micro-shards, and how the sticky mode routes rows by key.
:meth:`WorkPlan.join` puts every unit's output back in input order, so a planned call
returns exactly what the evenly split call returns. This module needs nothing but the
registered shard adapters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ._errors import DispatchArgumentError, NotShardableError
from ._nd import mesh_layout
from ._protocols import DispatchWorkerGroup
from ._shard import _describe, get_shard_adapter, split_args_kwargs

__all__ = [
    "PlanFn",
    "Slot",
    "WorkPlan",
    "WorkUnit",
    "balanced_plan",
    "even_plan",
    "mesh_slots",
    "rank_slots",
]


@dataclass(frozen=True)
class Slot:
    """Ranks that take the same unit together; the output of ``collect_rank`` is kept."""

    ranks: tuple[int, ...]
    collect_rank: int

    def __post_init__(self) -> None:
        if not self.ranks or self.collect_rank not in self.ranks:
            raise DispatchArgumentError(
                f"a slot needs ranks that include its collect rank, got ranks {self.ranks} "
                f"and collect rank {self.collect_rank}"
            )


@dataclass(frozen=True)
class WorkUnit:
    """One piece of a planned call.

    ``rows`` are the input rows (positions in the call's batch, padding excluded) that the
    unit's output holds, in the output's order; ``pad`` padding rows follow them in the
    output and are dropped before it is handed on. ``slot`` is the index of the slot the
    unit must run on, or ``None`` for any slot.
    """

    index: int
    rows: Sequence[int]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    slot: int | None = None
    pad: int = 0


@dataclass
class WorkPlan:
    """How one call's batch is cut into units and run on slots (see the module docstring).

    ``length`` is the number of input rows. ``release`` (when set) is told about every unit
    that finished or was abandoned, so that a router can keep count of the rows each slot
    still has to do.
    """

    mode: str
    slots: tuple[Slot, ...]
    units: tuple[WorkUnit, ...]
    length: int
    release: Callable[[WorkUnit], None] | None = field(default=None)

    def __post_init__(self) -> None:
        for unit in self.units:
            if unit.slot is not None and not 0 <= unit.slot < len(self.slots):
                raise DispatchArgumentError(
                    f"{self.mode}: unit {unit.index} is pinned to slot {unit.slot}, "
                    f"but the plan has {len(self.slots)} slots"
                )

    def trim(self, unit: WorkUnit, output: Any) -> Any:
        """``output`` of ``unit`` without its padding rows."""
        if not unit.pad:
            return output
        adapter = get_shard_adapter(output)
        if adapter is None:
            raise NotShardableError(
                f"{self.mode}: the output of unit {unit.index} ({type(output).__qualname__}) "
                "cannot be unpadded; return a DataProto, TensorDict or list"
            )
        return adapter.unpad(output, unit.pad)

    def join(self, outputs: Sequence[Any]) -> Any:
        """The trimmed outputs of every unit (in unit order) joined in input order."""
        if len(outputs) != len(self.units):
            raise DispatchArgumentError(
                f"{self.mode}: expected {len(self.units)} unit outputs, got {len(outputs)}"
            )
        kept = [(u, o) for u, o in zip(self.units, outputs, strict=True) if len(u.rows)]
        if not kept:
            raise DispatchArgumentError(f"{self.mode}: no outputs to collect")
        kinds = {type(o) for _, o in kept}
        if len(kinds) > 1:
            names = sorted(k.__qualname__ for k in kinds)
            raise NotShardableError(
                f"{self.mode}: outputs must all have one type to be joined, got {names}"
            )
        adapter = get_shard_adapter(kept[0][1])
        if adapter is None:
            raise NotShardableError(
                f"{self.mode}: outputs of type {type(kept[0][1]).__qualname__} cannot be "
                "joined; return a list, tuple, DataProto or TensorDict"
            )
        joined = adapter.concat([o for _, o in kept])
        order = [r for u, _ in kept for r in u.rows]
        if order == list(range(len(order))):
            return joined
        return take_rows(self.mode, joined, inverse(order))


class PlanFn(Protocol):
    """A mode's planner: ``plan_fn(worker_group, *args, **kwargs) -> WorkPlan``."""

    def __call__(self, worker_group: Any, /, *args: Any, **kwargs: Any) -> WorkPlan: ...


def inverse(order: Sequence[int]) -> list[int]:
    """The permutation that undoes ``order``: ``[order.index(i) for i in range(n)]``."""
    back = [0] * len(order)
    for position, row in enumerate(order):
        back[row] = position
    return back


def take_rows(mode: str, obj: Any, positions: Sequence[int]) -> Any:
    """The rows of ``obj`` at ``positions`` through its adapter's ``take``."""
    adapter = get_shard_adapter(obj)
    take = getattr(adapter, "take", None)
    if take is None:
        raise NotShardableError(
            f"{mode}: {type(obj).__qualname__} ({_describe(obj)}) cannot select rows by "
            "position; its shard adapter has no take(obj, positions)"
        )
    return take(obj, list(positions))


def rank_slots(worker_group: DispatchWorkerGroup) -> tuple[Slot, ...]:
    """One slot per rank (``DP_COMPUTE_PROTO`` and its relatives)."""
    n = worker_group.world_size
    return tuple(Slot((r,), r) for r in range(n))


def mesh_slots(worker_group: DispatchWorkerGroup, mesh_name: str) -> tuple[Slot, ...]:
    """One slot per dp group of ``mesh_name``: its ranks, and its collect rank."""
    dp_ranks, collect = mesh_layout(worker_group, mesh_name)
    groups: dict[int, list[int]] = {}
    collectors: dict[int, int] = {}
    for rank, (dp, flag) in enumerate(zip(dp_ranks, collect, strict=True)):
        groups.setdefault(dp, []).append(rank)
        if flag:
            collectors[dp] = rank
    return tuple(Slot(tuple(groups[d]), collectors[d]) for d in sorted(groups))


def batch_length(mode: str, args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    """The common row count of the call's batch arguments (checked by the splitter too)."""
    for value in (*args, *kwargs.values()):
        adapter = get_shard_adapter(value)
        if adapter is None:
            continue
        length = adapter.length(value)
        if length is None:
            raise DispatchArgumentError(
                f"{mode}: a planned call needs batches whose row count is known; "
                f"{type(value).__qualname__} {_describe(value)} does not know it yet "
                "(get() the future first)"
            )
        return int(length)
    raise NotShardableError(
        f"{mode}: a planned call needs at least one batch argument (DataProto, TensorDict, "
        "sc_dispatch.Rows) to cut into units"
    )


def _cut(
    mode: str, chunks: int, args: Sequence[Any], kwargs: dict[str, Any], allow_padding: bool
) -> tuple[list[tuple[tuple[Any, ...], dict[str, Any]]], int]:
    split_args, split_kwargs, pad = split_args_kwargs(
        mode, chunks, args, kwargs, allow_padding=allow_padding
    )
    pieces = [
        (tuple(a[i] for a in split_args), {k: v[i] for k, v in split_kwargs.items()})
        for i in range(chunks)
    ]
    return pieces, pad


def _cut_uneven(
    mode: str, chunks: int, args: Sequence[Any], kwargs: dict[str, Any]
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every argument cut into ``chunks`` contiguous parts whose sizes differ by at most one
    (the arguments are checked as for an even split: shardable batches of one length)."""
    length = batch_length(mode, args, kwargs)
    # the even splitter's checks (types, equal lengths), on a count that divides the batch
    split_args_kwargs(mode, 1, args, kwargs, allow_padding=False)
    named = [*args, *kwargs.values()]
    parts: list[list[Any]] = []
    for value in named:
        adapter = get_shard_adapter(value)
        if adapter is None:  # split_args_kwargs refused it already; kept for the type checker
            raise NotShardableError(f"{mode}: {_describe(value)} cannot be split")
        cut = adapter.chunk(value, chunks)
        if len(cut) != chunks:
            raise DispatchArgumentError(
                f"{mode}: adapter for {type(value).__qualname__} returned {len(cut)} parts of "
                f"{length} rows, expected {chunks}"
            )
        parts.append(list(cut))
    n_pos = len(args)
    return [
        (
            tuple(p[i] for p in parts[:n_pos]),
            {k: p[i] for k, p in zip(kwargs, parts[n_pos:], strict=True)},
        )
        for i in range(chunks)
    ]


def _piece_length(mode: str, piece: tuple[tuple[Any, ...], dict[str, Any]]) -> int:
    return batch_length(mode, piece[0], piece[1])


def even_plan(
    mode: str, slots: tuple[Slot, ...], args: Sequence[Any], kwargs: dict[str, Any]
) -> WorkPlan:
    """One unit per slot, pinned to it: the even split of the plain splitting modes (padded
    the same way), described as a plan so that it can be streamed."""
    length = batch_length(mode, args, kwargs)
    pieces, _ = _cut(mode, len(slots), args, kwargs, allow_padding=True)
    units: list[WorkUnit] = []
    start = 0
    for i, piece in enumerate(pieces):
        size = _piece_length(mode, piece)
        real = max(0, min(size, length - start))
        units.append(WorkUnit(i, range(start, start + real), *piece, slot=i, pad=size - real))
        start += real
    return WorkPlan(mode, slots, tuple(units), length)


def check_micro_shard_size(mode: str, micro_shard_size: object) -> int | None:
    """``micro_shard_size`` as a positive int or ``None`` (a default per call)."""
    if micro_shard_size is None:
        return None
    if (
        isinstance(micro_shard_size, bool)
        or not isinstance(micro_shard_size, int)
        or micro_shard_size < 1
    ):
        raise DispatchArgumentError(
            f"{mode}: micro_shard_size must be a positive int or None, got {micro_shard_size!r}"
        )
    return micro_shard_size


#: Micro-shards per slot when a load-balanced mode is given no micro-shard size.
DEFAULT_UNITS_PER_SLOT = 4


def balanced_plan(
    mode: str,
    slots: tuple[Slot, ...],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    micro_shard_size: int | None,
) -> WorkPlan:
    """Micro-shards of at most ``micro_shard_size`` rows (default: the batch over
    ``4 * slots``), contiguous and in order, that any free slot takes. No padding is needed:
    a micro-shard may be shorter than the others."""
    length = batch_length(mode, args, kwargs)
    if length == 0:
        raise DispatchArgumentError(f"{mode}: cannot cut an empty batch (0 rows) into micro-shards")
    size = micro_shard_size or max(1, math.ceil(length / (DEFAULT_UNITS_PER_SLOT * len(slots))))
    chunks = math.ceil(length / size)
    pieces = _cut_uneven(mode, chunks, args, kwargs)
    units: list[WorkUnit] = []
    start = 0
    for i, piece in enumerate(pieces):
        n = _piece_length(mode, piece)
        units.append(WorkUnit(i, range(start, start + n), *piece))
        start += n
    return WorkPlan(mode, slots, tuple(units), length)
