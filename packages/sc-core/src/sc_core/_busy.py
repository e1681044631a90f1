"""Calls a worker group gave up on while some ranks were still running them.

A blocking call stops waiting when its deadline passes, when a worker dies, or as soon as one
rank raises; the other ranks may still be running the method. A backend cancels that work
where it can (Ray cancels the methods of asyncio actors, and calls still queued); where it
cannot, the rank is *busy*: its next call starts only when the abandoned one finishes.
:class:`BusyRanks` remembers those ranks, so that the error that gave up names them, a later
call that has to wait behind them logs why, and ``WorkerGroup.busy_ranks`` shows them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["AbandonedCall", "BusyRanks"]


@dataclass(frozen=True)
class AbandonedCall:
    """A call a rank was still running when the group stopped waiting for it."""

    method: str
    abandoned_at: float  # time.monotonic()
    cancel_requested: bool

    def running_for(self) -> float:
        """Seconds since the group gave up on the call."""
        return time.monotonic() - self.abandoned_at


class BusyRanks:
    """The abandoned calls of a group's ranks; shared by the groups spawned from it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[AbandonedCall, Any]] = {}

    def __bool__(self) -> bool:
        """Whether any abandoned call is remembered (finished ones included until asked)."""
        return bool(self._calls)

    def record(self, rank: int, method: str, handle: Any, cancel_requested: bool) -> None:
        with self._lock:
            self._calls[rank] = (AbandonedCall(method, time.monotonic(), cancel_requested), handle)

    def forget(self, ranks: Iterable[int]) -> None:
        """Drop the abandoned calls of ``ranks`` (their workers were replaced)."""
        with self._lock:
            for rank in ranks:
                self._calls.pop(rank, None)

    def current(
        self, is_done: Callable[[Any], bool], ranks: Iterable[int] | None = None
    ) -> dict[int, AbandonedCall]:
        """The ranks still running an abandoned call (finished ones are forgotten)."""
        with self._lock:
            items = list(self._calls.items())
        wanted = None if ranks is None else set(ranks)
        out: dict[int, AbandonedCall] = {}
        finished: list[int] = []
        for rank, (call, handle) in items:
            if wanted is not None and rank not in wanted:
                continue
            if is_done(handle):
                finished.append(rank)
            else:
                out[rank] = call
        if finished:
            with self._lock:
                for rank in finished:
                    entry = self._calls.get(rank)
                    if entry is not None and is_done(entry[1]):
                        del self._calls[rank]
        return out


def describe_busy(busy: dict[int, AbandonedCall]) -> str:
    """One sentence naming the busy ranks and what they run."""
    parts = [
        f"rank {rank} ({call.method}, abandoned {call.running_for():.1f} s ago"
        f"{', cancel requested' if call.cancel_requested else ''})"
        for rank, call in sorted(busy.items())
    ]
    return (
        "still running an abandoned call: "
        + "; ".join(parts)
        + ". The backend cannot interrupt a running method of a non-async worker, so the "
        "next call on these ranks starts when it finishes (see WorkerGroup.busy_ranks)"
    )
