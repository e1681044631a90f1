"""Work plans: every call on a worker group, described as units of work on slots.

A dispatch mode turns the arguments of one call into a :class:`WorkPlan`:

* **slots** -- the groups of ranks that take work together (one rank each for
  ``DP_COMPUTE_PROTO`` and the per-rank modes; every dp group of a mesh for the N-d modes:
  all its ranks run the same unit and the output of its collect rank is kept; the ranks
  registered with ``receives_data=False`` get the unit's metadata-only form,
  :meth:`WorkPlan.rank_arguments`);
* **units** -- the arguments of one piece of work, each naming the input rows its output
  holds (none for modes whose outputs are not rows), and the slot it is pinned to
  (``None``: whichever slot is free first);
* **the join** -- row shards put back in input order, padding dropped (the default), or a
  ``collect`` function over the unit outputs (a per-rank list, rank 0's value, verl's
  ``collect_fn``).

The even split pins one unit to each slot (:func:`even_plan`); verl's per-rank rule pins one
unit to each rank (:func:`rank_plan`); the load-balanced mode leaves micro-shards unpinned so
that free ranks pull them (:func:`balanced_plan`); the sticky mode pins each key's rows to
its slot. A worker group (sc-core) starts the pinned units at once, gives unpinned ones to
free slots, and can hand row units back one by one as they finish (a streamed call).
:meth:`WorkPlan.join` gives the same result whichever way the units ran. This module needs
nothing but the registered shard adapters.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ._errors import DispatchArgumentError, NotShardableError
from ._metadata import MetadataCache, metadata_arguments
from ._nbytes import payload_nbytes
from ._protocols import DispatchWorkerGroup
from ._shard import (
    _chunked,
    _describe,
    concat_outputs,
    get_shard_adapter,
    per_rank_arguments,
    split_args_kwargs,
    unpad_output,
)

__all__ = [
    "PlanFn",
    "Slot",
    "WorkPlan",
    "WorkUnit",
    "balanced_plan",
    "even_plan",
    "rank_plan",
    "rank_slots",
    "rank_zero_plan",
]


@dataclass(frozen=True)
class Slot:
    """Ranks that take the same unit together; the output of ``collect_rank`` is kept.

    ``data_ranks`` are the ranks that receive the unit's data (``None``, the default: all
    of them); the others receive its metadata-only form (see :meth:`WorkPlan.rank_arguments`).
    """

    ranks: tuple[int, ...]
    collect_rank: int
    data_ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.ranks or self.collect_rank not in self.ranks:
            raise DispatchArgumentError(
                f"a slot needs ranks that include its collect rank, got ranks {self.ranks} "
                f"and collect rank {self.collect_rank}"
            )
        if self.data_ranks is not None and (
            not self.data_ranks or not set(self.data_ranks) <= set(self.ranks)
        ):
            raise DispatchArgumentError(
                f"a slot needs data ranks among its ranks and at least one, got ranks "
                f"{self.ranks} and data ranks {self.data_ranks}"
            )


@dataclass(slots=True)
class WorkUnit:
    """One piece of a planned call.

    ``rows`` are the input rows (positions in the call's batch, padding excluded) that the
    unit's output holds, in the output's order; ``pad`` padding rows follow them in the
    output and are dropped before it is handed on. ``slot`` is the index of the slot the
    unit must run on, or ``None`` for any slot. Treat a unit as immutable once its plan is
    made (it is not frozen: every call makes one per rank, and a frozen dataclass costs
    three times as much to build).
    """

    index: int
    rows: Sequence[int]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    slot: int | None = None
    pad: int = 0


@dataclass
class WorkPlan:
    """How one call is cut into units and run on slots (see the module docstring).

    ``length`` is the number of input rows (``None`` when the batch is a future whose row
    count is not known yet: such a plan runs, but cannot be streamed). ``collect`` joins the
    unit outputs (in unit order) when they are not row shards of the input: a list of
    per-rank values, rank 0's value, a verl ``collect_fn``; ``None`` (the default) joins
    row shards in input order, padding dropped. ``release`` (when set) is told about every
    unit that finished or was abandoned, so that a router can keep count of the rows each
    slot still has to do. A slot takes at most one pinned unit.
    """

    mode: str
    slots: tuple[Slot, ...]
    units: tuple[WorkUnit, ...]
    length: int | None
    release: Callable[[WorkUnit], None] | None = field(default=None)
    collect: Callable[[list[Any]], Any] | None = field(default=None)
    _metadata: MetadataCache = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        slots = [u.slot for u in self.units if u.slot is not None]
        if not slots or (
            len(set(slots)) == len(slots) and min(slots) >= 0 and max(slots) < len(self.slots)
        ):
            return
        pinned: set[int] = set()
        for unit in self.units:
            if unit.slot is None:
                continue
            if not 0 <= unit.slot < len(self.slots):
                raise DispatchArgumentError(
                    f"{self.mode}: unit {unit.index} is pinned to slot {unit.slot}, "
                    f"but the plan has {len(self.slots)} slots"
                )
            if unit.slot in pinned:
                raise DispatchArgumentError(
                    f"{self.mode}: unit {unit.index} is pinned to slot {unit.slot}, which "
                    "another unit is pinned to already (a slot takes one pinned unit)"
                )
            pinned.add(unit.slot)

    def rank_arguments(
        self, unit: WorkUnit, slot: int
    ) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """The ``(args, kwargs)`` each rank of ``self.slots[slot]`` receives to run ``unit``,
        in the slot's rank order: the unit's own for its data ranks (all of them unless the
        slot names some), its metadata-only form for the others -- each batch argument whose
        adapter has ``metadata_only`` replaced by that (one object per argument and row count
        for the whole call, which a backend sends once), any other argument unchanged."""
        target = self.slots[slot]
        whole = (unit.args, unit.kwargs)
        if target.data_ranks is None or len(target.data_ranks) == len(target.ranks):
            return [whole] * len(target.ranks)
        meta = metadata_arguments(self.mode, unit.args, unit.kwargs, self._metadata)
        return [whole if r in target.data_ranks else meta for r in target.ranks]

    def rank_nbytes(self) -> dict[int, int]:
        """The payload bytes (:func:`~sc_dispatch.ext.payload_nbytes`) of the arguments each
        rank receives for the pinned units, by rank: what the call delivers to each worker
        (a value several ranks receive counts once for each). Free units, which go to
        whichever slot is idle, are not counted."""
        sizes: dict[int, int] = {}
        for unit in self.units:
            if unit.slot is None:
                continue
            ranks = self.slots[unit.slot].ranks
            for rank, (args, kwargs) in zip(
                ranks, self.rank_arguments(unit, unit.slot), strict=True
            ):
                total = sum(payload_nbytes(v) for v in (*args, *kwargs.values()))
                sizes[rank] = sizes.get(rank, 0) + total
        return sizes

    @property
    def joins_in_order(self) -> bool:
        """Whether the plan joins its units' outputs itself, as row shards of the input in input
        order (it has no collect function)."""
        return self.collect is None

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
        """The call's result from every unit's output (in unit order, padding included).

        Row shards in input order with the padding at the end (an even split) are joined
        as they came and unpadded once; other row plans have each output trimmed and the
        rows put back in input order."""
        if len(outputs) != len(self.units):
            raise DispatchArgumentError(
                f"{self.mode}: expected {len(self.units)} unit outputs, got {len(outputs)}"
            )
        if self.collect is not None:
            return self.collect(list(outputs))
        if _in_order(self.units) and _padding_trails(self.units):
            joined = concat_outputs(self.mode, list(outputs))
            return unpad_output(joined, sum(u.pad for u in self.units))
        kept = [(u, self.trim(u, o)) for u, o in zip(self.units, outputs, strict=True) if u.rows]
        joined = concat_outputs(self.mode, [o for _, o in kept])
        if _in_order([u for u, _ in kept]):
            return joined
        return take_rows(self.mode, joined, inverse([r for u, _ in kept for r in u.rows]))


def _in_order(units: Sequence[WorkUnit]) -> bool:
    """Whether the units' rows, one unit after another, are 0, 1, 2, ... (a unit's range of
    rows is checked by its ends, without walking it: joins are on every call's path)."""
    position = 0
    for unit in units:
        rows, count = unit.rows, len(unit.rows)
        if isinstance(rows, range):
            if count and (rows.start != position or rows.step != 1):
                return False
        elif list(rows) != list(range(position, position + count)):
            return False
        position += count
    return True


def _padding_trails(units: Sequence[WorkUnit]) -> bool:
    """Whether every padding row comes after every real row (units in order)."""
    padded = False
    for unit in units:
        if padded and len(unit.rows):
            return False
        padded = padded or unit.pad > 0
    return True


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
    return _rank_slots(worker_group.world_size)


@functools.lru_cache(maxsize=64)
def _rank_slots(world_size: int) -> tuple[Slot, ...]:
    # slots are immutable: every call on a group of this size shares them
    return tuple(Slot((r,), r) for r in range(world_size))


def batch_length(mode: str, args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    """The common row count of the call's batch arguments (checked by the splitter too)."""
    length = _length(mode, args, kwargs)
    if length is None:
        value = next(v for v in (*args, *kwargs.values()) if get_shard_adapter(v) is not None)
        raise DispatchArgumentError(
            f"{mode}: a planned call needs batches whose row count is known; "
            f"{type(value).__qualname__} {_describe(value)} does not know it yet "
            "(get() the future first)"
        )
    return length


def _length(mode: str, args: Sequence[Any], kwargs: dict[str, Any]) -> int | None:
    """The row count of the first batch argument (``None``: a future that does not know it
    yet); no batch argument at all is a :class:`~sc_dispatch.NotShardableError`."""
    for value in (*args, *kwargs.values()):
        adapter = get_shard_adapter(value)
        if adapter is None:
            continue
        length = adapter.length(value)
        if length is None:
            return None
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
        parts.append(_chunked(mode, adapter, value, chunks, f"parts of {length} rows"))
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
    """One unit per slot, pinned to it: the even split of the splitting modes (padded at the
    end when auto-padding is on). A batch that is a future of unknown length is split lazily;
    its units then name no rows (the plan runs, but cannot be streamed)."""
    pieces, _ = _cut(mode, len(slots), args, kwargs, allow_padding=True)
    length = _length(mode, args, kwargs)
    units: list[WorkUnit] = []
    start = 0
    for i, piece in enumerate(pieces):
        if length is None:
            units.append(WorkUnit(i, (), *piece, slot=i))
            continue
        size = _piece_length(mode, piece)
        real = max(0, min(size, length - start))
        units.append(WorkUnit(i, range(start, start + real), *piece, slot=i, pad=size - real))
        start += real
    return WorkPlan(mode, slots, tuple(units), length)


def rank_plan(
    mode: str,
    world_size: int,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    collect: Callable[[list[Any]], Any] = list,
) -> WorkPlan:
    """verl's ``execute_all`` rule as a plan: one unit pinned to each of ``world_size``
    ranks; when every argument is a list of world-size entries, rank ``i`` gets entry ``i``
    of each, otherwise every rank gets all the arguments. ``collect`` joins the outputs
    (rank order; default: the list of them)."""
    pieces = per_rank_arguments(world_size, args, kwargs)
    units = tuple([WorkUnit(r, (), a, k, r) for r, (a, k) in enumerate(pieces)])
    return WorkPlan(mode, _rank_slots(world_size), units, None, collect=collect)


def rank_zero_plan(
    mode: str,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    collect: Callable[[list[Any]], Any] = list,
) -> WorkPlan:
    """One unit on rank 0 with the arguments whole (verl's ``execute_rank_zero``);
    ``collect`` gets the one-element list of its output."""
    unit = WorkUnit(0, (), tuple(args), dict(kwargs), slot=0)
    return WorkPlan(mode, (Slot((0,), 0),), (unit,), None, collect=collect)


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
