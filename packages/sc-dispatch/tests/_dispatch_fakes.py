"""Test doubles for the sc-dispatch tests: a paddable batch, a future, and the shipped fake
worker group (``sc_dispatch.testing.FakeWorkerGroup``, re-exported here).

``run_call`` plays the part of a worker group's bound method (plan → run every unit on its
slot's ranks → join), so that every mode is exercised the way sc-core and sc-ray drive it;
``per_rank`` shows what verl's dispatch function of a mode sends each rank.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hypothesis import settings
from sc_dispatch import Dispatch, Execute
from sc_dispatch.ext import (
    DispatchModeSpec,
    FunctionMode,
    chunk_sizes,
    pop_padding_size,
    register_future_type,
    register_shardable,
    resolve_dispatch_mode,
)
from sc_dispatch.testing import FakeWorkerGroup

__all__ = [
    "BATCH_ADAPTER",
    "PROPERTY",
    "Batch",
    "BatchAdapter",
    "FakeFuture",
    "FakeWorkerGroup",
    "UnregisteredFuture",
    "per_rank",
    "pick",
    "run_call",
    "unique_name",
]

#: Settings for every property test: no deadline (the machine is shared), modest counts.
PROPERTY = settings(deadline=None, max_examples=60)

_names = itertools.count()


def unique_name(prefix: str = "TEST_MODE") -> str:
    """A ``Dispatch`` member name no other test uses."""
    return f"{prefix}_{next(_names)}"


class Batch:
    """A list-like container of rows, shardable through ``BatchAdapter``.

    ``auto_pad`` is what the adapter's ``auto_padding`` answers for this batch. Rows are held
    in a tuple, so the only way to change a batch is to rebind ``rows`` — which the tests
    watch for.
    """

    def __init__(self, rows: Sequence[Any], *, auto_pad: bool = True) -> None:
        self.rows: tuple[Any, ...] = tuple(rows)
        self.auto_pad = auto_pad

    def __len__(self) -> int:
        return len(self.rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Batch) and other.rows == self.rows

    def __hash__(self) -> int:
        return hash(self.rows)

    def __repr__(self) -> str:
        return f"Batch({list(self.rows)!r}, auto_pad={self.auto_pad})"


class BatchAdapter:
    """``ShardAdapter[Batch]``: contiguous slices, padding cycles rows from the start."""

    def __init__(self) -> None:
        self.pad_calls: list[tuple[int, int]] = []

    def length(self, obj: Batch) -> int:
        return len(obj.rows)

    def chunk(self, obj: Batch, chunks: int) -> list[Batch]:
        if not 1 <= chunks <= len(obj.rows):
            raise AssertionError(f"chunk called outside its contract: {chunks} of {obj!r}")
        parts: list[Batch] = []
        start = 0
        for size in chunk_sizes(len(obj.rows), chunks):
            parts.append(Batch(obj.rows[start : start + size], auto_pad=obj.auto_pad))
            start += size
        return parts

    def concat(self, parts: Sequence[Batch]) -> Batch:
        return Batch([row for part in parts for row in part.rows])

    def pad(self, obj: Batch, pad_size: int) -> Batch:
        self.pad_calls.append((len(obj.rows), pad_size))
        extra = [obj.rows[i % len(obj.rows)] for i in range(pad_size)]
        return Batch([*obj.rows, *extra], auto_pad=obj.auto_pad)

    def unpad(self, obj: Batch, pad_size: int) -> Batch:
        return Batch(obj.rows[: len(obj.rows) - pad_size], auto_pad=obj.auto_pad)

    def auto_padding(self, obj: Batch) -> bool:
        return obj.auto_pad


BATCH_ADAPTER = BatchAdapter()
register_shardable(Batch, BATCH_ADAPTER)


class FakeFuture:
    """A registered future type: ``get()`` returns the value and counts the calls."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.gets = 0

    def get(self) -> Any:
        self.gets += 1
        return self.value


register_future_type(FakeFuture)


class UnregisteredFuture:
    """Has ``get()`` like a future, but its type is never registered."""

    def get(self) -> Any:
        raise AssertionError("an unregistered future type must not be resolved")


Worker = Callable[..., Any]


def pick(value: Any, rank: int, world_size: int) -> Any:
    """verl's ``execute_all`` rule: a list of world-size entries is split, anything else is
    broadcast."""
    if isinstance(value, list) and len(value) == world_size:
        return value[rank]
    return value


def run_call(
    worker_group: FakeWorkerGroup,
    dispatch_mode: Dispatch | Mapping[str, Any],
    worker: Worker,
    *args: Any,
    execute_mode: Execute = Execute.ALL,
    **kwargs: Any,
) -> Any:
    """One call through a worker group: ``worker(rank, *args, **kwargs)`` runs on every rank
    of a unit's slot with the arguments the plan gives that rank (unpinned units go to the
    slots in turn); the collect rank's output of each unit is joined."""
    spec: DispatchModeSpec = resolve_dispatch_mode(dispatch_mode)
    plan = spec.plan(worker_group, execute_mode, args, kwargs)
    outputs: list[Any] = []
    for i, unit in enumerate(plan.units):
        index = i % len(plan.slots) if unit.slot is None else unit.slot
        slot = plan.slots[index]
        ran = {
            rank: worker(rank, *a, **k)
            for rank, (a, k) in zip(slot.ranks, plan.rank_arguments(unit, index), strict=True)
        }
        outputs.append(ran[slot.collect_rank])
    return plan.join(outputs)


def functions_of(mode: DispatchModeSpec | Dispatch | Mapping[str, Any]) -> FunctionMode:
    """verl's functions (and their flags) of a mode that has them."""
    spec = mode if isinstance(mode, DispatchModeSpec) else resolve_dispatch_mode(mode)
    if spec.functions is None:
        raise AssertionError(f"{spec.name} has no verl functions")
    return spec.functions


def per_rank(
    worker_group: FakeWorkerGroup,
    dispatch_mode: Dispatch | Mapping[str, Any],
    *args: Any,
    **kwargs: Any,
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]], int]:
    """Dispatch only: what each rank would receive, and the padding size."""
    spec = resolve_dispatch_mode(dispatch_mode)
    d_args, d_kwargs = spec.dispatch_fn(worker_group, *args, **kwargs)
    d_kwargs = dict(d_kwargs)
    pad = pop_padding_size(d_kwargs)
    n = worker_group.world_size
    rank_args = [tuple(a[r] for a in d_args) for r in range(n)]
    rank_kwargs = [{k: v[r] for k, v in d_kwargs.items()} for r in range(n)]
    return rank_args, rank_kwargs, pad
