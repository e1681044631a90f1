"""Test helpers for the sc-core tests: a paddable batch, worker classes, group builders."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hypothesis import settings
from sc_core import ClassWithInitArgs, LocalWorkerGroup, ResourcePool, Worker
from sc_dispatch import Dispatch, Execute, Rows, register
from sc_dispatch.ext import chunk_sizes, register_shardable

#: Settings for every property test: no deadline (the machine is shared), few examples.
PROPERTY = settings(deadline=None, max_examples=15)

_names = itertools.count()


def unique_name(prefix: str = "CORE_TEST_MODE") -> str:
    """A ``Dispatch`` member name no other test uses."""
    return f"{prefix}_{next(_names)}"


class Batch:
    """A list of rows that asks to be padded (auto_padding), like a DataProto can."""

    def __init__(self, rows: Sequence[Any], auto_pad: bool = True) -> None:
        self.rows = list(rows)
        self.auto_pad = auto_pad

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Batch) and other.rows == self.rows

    def __hash__(self) -> int:  # pragma: no cover - not hashed in tests
        return hash(tuple(self.rows))

    def __repr__(self) -> str:
        return f"Batch({self.rows})"


class BatchAdapter:
    """The shard adapter of :class:`Batch`: contiguous chunks, pad by repeating from the start."""

    def length(self, obj: Batch) -> int:
        return len(obj.rows)

    def chunk(self, obj: Batch, chunks: int) -> list[Batch]:
        parts: list[Batch] = []
        start = 0
        for size in chunk_sizes(len(obj.rows), chunks):
            parts.append(Batch(obj.rows[start : start + size], obj.auto_pad))
            start += size
        return parts

    def concat(self, parts: Sequence[Batch]) -> Batch:
        return Batch([row for part in parts for row in part.rows], parts[0].auto_pad)

    def pad(self, obj: Batch, pad_size: int) -> Batch:
        extra = [obj.rows[i % len(obj.rows)] for i in range(pad_size)]
        return Batch([*obj.rows, *extra], obj.auto_pad)

    def unpad(self, obj: Batch, pad_size: int) -> Batch:
        return Batch(obj.rows[: len(obj.rows) - pad_size], obj.auto_pad)

    def auto_padding(self, obj: Batch) -> bool:
        return obj.auto_pad

    def take(self, obj: Batch, positions: Sequence[int]) -> Batch:
        return Batch([obj.rows[i] for i in positions], obj.auto_pad)


register_shardable(Batch, BatchAdapter())


class CountingWorker(Worker):
    """Counts how often each method ran (``ran``, by name; ``counts`` returns a copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: dict[str, int] = {}

    def _count(self, name: str) -> int:
        self.ran[name] = self.ran.get(name, 0) + 1
        return self.ran[name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def counts(self) -> dict[str, int]:
        return dict(self.ran)


class Plain:
    """A worker class that is not an sc ``Worker``."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def hello(self) -> str:
        return "hi"


class EchoWorker(Worker):
    """One method per predefined dispatch mode, each recording what it received."""

    def __init__(self, tag: str = "w") -> None:
        super().__init__()
        self.tag = tag
        self.seen: list[Any] = []

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def one_to_all(self, value: Any, *, key: Any = None) -> tuple[int, Any, Any]:
        self.seen.append(value)
        return (self.rank, value, key)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def all_to_all(self, value: Any) -> tuple[int, Any]:
        return (self.rank, value)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero(self, value: Any) -> tuple[int, Any]:
        self.seen.append(value)
        return (self.rank, value)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def dp_compute(self, value: Any, *, other: Any = None) -> tuple[int, Any, Any]:
        return (self.rank, value, other)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def shard_rows(self, batch: Batch) -> Batch:
        """Tags each row with the rank that saw it."""
        return Batch([(self.rank, row) for row in batch.rows])

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def shard_lists(self, rows: Rows) -> Rows:
        return Rows(row * 10 for row in rows)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def metric(self, batch: Batch) -> dict[str, Any]:
        return {"rank": self.rank, "rows": list(batch.rows)}

    @register(dispatch_mode=Dispatch.DIRECT_ROLLOUT_METHOD)
    def rollout_only(self) -> None:  # pragma: no cover - never reached from the driver
        return None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def first_only(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def async_rank(self, delay: float = 0.0) -> int:
        await asyncio.sleep(delay)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, ranks: Sequence[int]) -> int:
        if self.rank in ranks:
            raise ValueError(f"rank {self.rank} refuses")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wait_for(self, ranks: Sequence[int], release: threading.Event) -> int:
        """Ranks in ``ranks`` block until the test sets ``release`` (30 s at most)."""
        if self.rank in ranks and not release.wait(30):
            raise TimeoutError("the test never released the worker")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def later(self, value: int) -> int:
        return value + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def register_mesh(self, mesh: str, dp_rank: int, is_collect: bool) -> None:
        self._register_dispatch_collect_info(mesh, dp_rank, is_collect)

    def not_registered(self) -> None:
        """A plain method: never bound on the group."""


def make_group(
    world: Sequence[int] = (2,), cls: type[Any] = EchoWorker, *args: Any, **kwargs: Any
) -> LocalWorkerGroup:
    return LocalWorkerGroup(ResourcePool(list(world)), ClassWithInitArgs(cls, *args), **kwargs)


@contextmanager
def group(
    world: Sequence[int] = (2,), cls: type[Any] = EchoWorker, *args: Any, **kwargs: Any
) -> Iterator[LocalWorkerGroup]:
    """A group that is closed (rank threads stopped) after the block."""
    wg = make_group(world, cls, *args, **kwargs)
    try:
        yield wg
    finally:
        wg.close()
