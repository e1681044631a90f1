"""Planned calls: the units of a :class:`~sc_dispatch.WorkPlan` started on free slots and
handed back one by one as each finishes.

This is what a streamed call (``proxy.stream(...)``) and the load-balanced and sticky modes
run on. :class:`PlanRun` starts the units pinned to a slot (a rank, or a dp group of a mesh)
at once and keeps every slot busy with the unpinned ones: a slot that finishes a unit takes
the next, so fast ranks pull more micro-shards than slow ones. Every unit is an ordinary
start of the method on the slot's ranks (:func:`~sc_core._pipeline.start`), sharing the
call's deadline and span; the driver waits for whichever unit finishes first with the
backend's optional ``wait_any`` (``ray.wait`` on Ray, ``concurrent.futures.wait``
in-process), else by polling ``is_done``.

A failure ends the run with the same typed error as a blocking call (the group gives up on
the units still running); a run closed early abandons its running units the same way.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from sc_dispatch.ext import WorkPlan, WorkUnit

from ._backend import Backend, CallHandle
from ._call import Call
from ._errors import CallTimeoutError
from ._pipeline import give_up, route, start, wait

if TYPE_CHECKING:
    from ._worker_group import WorkerGroup

__all__ = ["PlanRun", "StreamingBackend"]

#: How often a backend without ``wait_any`` is polled for finished units (seconds).
_POLL_S = 0.002


@runtime_checkable
class StreamingBackend(Protocol):
    """A backend that can wait for the first of several rank calls (optional, beside
    :class:`~sc_core.Backend`; without it a planned call polls ``is_done``)."""

    def wait_any(self, rank_handles: Sequence[Any], timeout: float | None) -> list[int]:
        """Positions in ``rank_handles`` of the calls that have finished (value or error),
        at least one unless ``timeout`` seconds pass first (then possibly none)."""
        ...


@dataclass
class _Running:
    unit: WorkUnit
    slot: int
    handle: CallHandle


#: A slot whose time per row is within this factor of the fastest slot's counts as keeping
#: up: it gets a second unit queued behind the one it runs (see :meth:`PlanRun._fill`).
_KEEPS_UP = 1.5


class PlanRun:
    """One planned call in flight: iterate it for ``(unit, output)`` in completion order
    (``output`` without its padding rows; units of padding only are skipped).

    Units pinned to a slot all start at once. Unpinned units go to idle slots; a slot that
    has shown it keeps up (its seconds per row within 1.5x the fastest slot's) also gets a
    second unit queued behind its current one while at least one unit per slot is left,
    which hides the driver's round trip between units. A slow slot only ever holds one, and
    an idle slot is given nothing when the other busy slots, at the speeds they have shown,
    would finish every unit left before it finished the next one: at the end of the batch a
    straggler is not left with work the others could have done.
    """

    def __init__(
        self,
        group: WorkerGroup,
        call: Call,
        plan: WorkPlan,
        method_name: str,
        backend: Backend,
    ) -> None:
        self._group = group
        self._call = call
        self._plan = plan
        self._method = method_name
        self._backend = backend
        self._wait_any = getattr(backend, "wait_any", None)
        self._free: collections.deque[WorkUnit] = collections.deque()
        self._running: dict[int, list[_Running]] = {i: [] for i in range(len(plan.slots))}
        #: seconds per row each slot took for its last unit, and when its current one began
        self._per_row: dict[int, float] = {}
        self._busy_since: dict[int, float] = {}
        self._done: collections.deque[tuple[WorkUnit, Any]] = collections.deque()
        #: every unit ran to its end (not abandoned)
        self.finished = False
        pinned = [u for u in plan.units if u.slot is not None]
        self._free.extend(u for u in plan.units if u.slot is None)
        launched = 0
        try:
            for unit in pinned:
                self._launch(unit, cast(int, unit.slot))
                launched += 1
        except BaseException as exc:
            for unit in pinned[launched:]:
                self._release(unit)
            self.abandon(exc)
            raise

    @property
    def plan(self) -> WorkPlan:
        return self._plan

    def _in_flight(self) -> bool:
        return any(self._running.values())

    def __iter__(self) -> PlanRun:
        return self

    def __next__(self) -> tuple[WorkUnit, Any]:
        while True:
            while self._done:
                unit, output = self._done.popleft()
                if len(unit.rows):
                    return unit, output
            try:
                self._fill()
            except BaseException as exc:
                self.abandon(exc)
                raise
            if not self._in_flight():
                self.finished = True
                raise StopIteration
            self._wait_some()

    # --- starting units -------------------------------------------------------------------

    def _keeps_up(self, slot: int) -> bool:
        mine = self._per_row.get(slot)
        return mine is not None and mine <= _KEEPS_UP * min(self._per_row.values())

    def _backlog_s(self, index: int, now: float) -> float:
        """Seconds the units queued on slot ``index`` still need, at its speed so far."""
        rows = sum(len(r.unit.rows) + r.unit.pad for r in self._running[index])
        elapsed = now - self._busy_since.get(index, now)
        return max(0.0, self._per_row[index] * rows - elapsed)

    def _worth_waiting_for(self, index: int) -> bool:
        """Whether this slot is slow (not within 1.5x of the fastest) and the other busy
        slots, at the speeds they have shown and after the units they already hold, would
        finish every unit left before it finished the next one alone: then it stays idle, so
        that a straggler is not handed the batch's last units."""
        mine = self._per_row.get(index)
        others = [
            i for i in self._per_row if i != index and self._per_row[i] > 0 and self._running[i]
        ]
        if mine is None or not others or not self._free or self._keeps_up(index):
            return False
        now = time.monotonic()
        rows_left = sum(len(u.rows) + u.pad for u in self._free)
        rate = sum(1 / self._per_row[i] for i in others)  # rows per second
        backlog_rows = sum(self._backlog_s(i, now) / self._per_row[i] for i in others)
        others_done_s = (rows_left + backlog_rows) / rate
        next_rows = len(self._free[0].rows) + self._free[0].pad
        return mine * next_rows > others_done_s

    def _fill(self) -> None:
        """Give every idle slot a unit (unless the others will finish the rest sooner), and
        a second one to slots that keep up."""
        slots = len(self._plan.slots)
        for index in range(slots):
            if self._free and not self._running[index] and not self._worth_waiting_for(index):
                self._launch(self._free.popleft(), index)
        for index in range(slots):
            queued = self._running[index]
            if len(self._free) >= slots and len(queued) == 1 and self._keeps_up(index):
                self._launch(self._free.popleft(), index)

    def _launch(self, unit: WorkUnit, index: int) -> None:
        group = self._group
        slot = self._plan.slots[index]
        part = self._call.part(slot.ranks)
        group._liveness.check_alive(part)
        target, args = route(group, self._method, unit.args, unit.kwargs, 1)
        rank_args = [(args, unit.kwargs)] * len(slot.ranks)
        handle = start(group, part, target, rank_args, self._backend)
        if not self._running[index]:
            self._busy_since[index] = time.monotonic()
        self._running[index].append(_Running(unit, index, handle))

    # --- waiting for units ------------------------------------------------------------------

    def _finished(self) -> list[_Running]:
        """Running units with at least one finished rank call (waited for within the
        deadline), each slot's in the order they were queued."""
        entries = [r for queue in self._running.values() for r in queue]
        handles = [h for r in entries for h in r.handle.rank_handles]
        owners = [r for r in entries for _ in r.handle.rank_handles]
        call = self._call
        while True:
            if self._wait_any is not None:
                done = self._wait_any(handles, call.remaining())
            else:
                done = [i for i, h in enumerate(handles) if self._backend.is_done(h)]
                if not done and not call.expired():
                    time.sleep(_POLL_S)
                    continue
            if done:
                hit = {id(owners[i]) for i in done}
                return [r for r in entries if id(r) in hit]
            if call.expired():
                ranks = sorted(r for e in entries for r in e.handle.call.ranks)
                raise CallTimeoutError(call.method_name, ranks, call.timeout)

    def _wait_some(self) -> None:
        try:
            for running in self._finished():
                values = wait(self._group, running.handle, self._backend)
                self._complete(running, values)
        except BaseException as exc:
            self.abandon(exc)
            raise

    def _complete(self, running: _Running, values: list[Any]) -> None:
        index, unit = running.slot, running.unit
        queue = self._running[index]
        queue.remove(running)
        now = time.monotonic()
        rows = max(1, len(unit.rows) + unit.pad)
        self._per_row[index] = (now - self._busy_since.get(index, now)) / rows
        self._busy_since[index] = now
        self._release(unit)
        slot = self._plan.slots[index]
        output = values[slot.ranks.index(slot.collect_rank)]
        self._done.append((unit, self._plan.trim(unit, output)))

    def _release(self, unit: WorkUnit) -> None:
        if self._plan.release is not None:
            self._plan.release(unit)

    def abandon(self, exc: BaseException | None = None) -> None:
        """Stop waiting for the units still running (the group remembers the busy ranks and
        says so in ``exc``) and release every unit not done."""
        running = [r for queue in self._running.values() for r in queue]
        for queue in self._running.values():
            queue.clear()
        for entry in running:
            give_up(self._group, entry.handle, exc)
            self._release(entry.unit)
        while self._free:
            self._release(self._free.popleft())
