"""Planned calls: the units of a :class:`~sc_dispatch.WorkPlan` started on free slots and
handed back one by one as each finishes.

This is what a streamed call (``proxy.stream(...)``) and the load-balanced and sticky modes
run on. :class:`PlanRun` keeps every slot (a rank, or a dp group of a mesh) busy: a slot that
finishes a unit gets the next unit pinned to it, else the next unpinned one, so fast ranks
pull more micro-shards than slow ones. Every unit is an ordinary start of the method on the
slot's ranks (:func:`~sc_core._pipeline.start`), sharing the call's deadline and span; the
driver waits for whichever unit finishes first with the backend's optional ``wait_any``
(``ray.wait`` on Ray, ``concurrent.futures.wait`` in-process), else by polling ``is_done``.

A failure ends the run with the same typed error as a blocking call (the group gives up on
the units still running); a run closed early abandons its running units the same way.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sc_dispatch import Slot, WorkPlan, WorkUnit

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


class PlanRun:
    """One planned call in flight: iterate it for ``(unit, output)`` in completion order
    (``output`` without its padding rows; units of padding only are skipped)."""

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
        self._pinned: dict[int, collections.deque[WorkUnit]] = {}
        self._free: collections.deque[WorkUnit] = collections.deque()
        for unit in plan.units:
            if unit.slot is None:
                self._free.append(unit)
            else:
                self._pinned.setdefault(unit.slot, collections.deque()).append(unit)
        self._running: dict[int, _Running] = {}  # by slot index
        self._done: collections.deque[tuple[WorkUnit, Any]] = collections.deque()
        #: every unit ran to its end (not abandoned)
        self.finished = False

    @property
    def plan(self) -> WorkPlan:
        return self._plan

    def __iter__(self) -> PlanRun:
        return self

    def __next__(self) -> tuple[WorkUnit, Any]:
        while True:
            while self._done:
                unit, output = self._done.popleft()
                if len(unit.rows):
                    return unit, output
            self._fill()
            if not self._running:
                self.finished = True
                raise StopIteration
            self._wait_some()

    # --- starting units -------------------------------------------------------------------

    def _next_unit(self, slot: int) -> WorkUnit | None:
        pinned = self._pinned.get(slot)
        if pinned:
            return pinned.popleft()
        if self._free:
            return self._free.popleft()
        return None

    def _fill(self) -> None:
        """Start a unit on every idle slot that has work."""
        for index, slot in enumerate(self._plan.slots):
            if index in self._running:
                continue
            unit = self._next_unit(index)
            if unit is not None:
                self._running[index] = _Running(unit, index, self._start(unit, slot))

    def _start(self, unit: WorkUnit, slot: Slot) -> CallHandle:
        group = self._group
        part = self._call.part(slot.ranks)
        group._liveness.check_alive(part)
        target, args = route(group, self._method, unit.args, unit.kwargs, 1)
        rank_args = [(args, unit.kwargs)] * len(slot.ranks)
        return start(group, part, target, rank_args, self._backend)

    # --- waiting for units ------------------------------------------------------------------

    def _finished_slots(self) -> list[int]:
        """Slots with at least one finished rank call: wait for any, within the deadline."""
        entries = list(self._running.values())
        handles = [h for r in entries for h in r.handle.rank_handles]
        owners = [r.slot for r in entries for _ in r.handle.rank_handles]
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
                return sorted({owners[i] for i in done})
            if call.expired():
                ranks = sorted(r for e in entries for r in e.handle.call.ranks)
                raise CallTimeoutError(call.method_name, ranks, call.timeout)

    def _wait_some(self) -> None:
        try:
            slots = self._finished_slots()
            for slot in slots:
                running = self._running[slot]
                values = wait(self._group, running.handle, self._backend)
                del self._running[slot]
                self._release(running.unit)
                ranks = self._plan.slots[slot].ranks
                output = values[ranks.index(self._plan.slots[slot].collect_rank)]
                self._done.append((running.unit, self._plan.trim(running.unit, output)))
        except BaseException as exc:
            self.abandon(exc)
            raise

    def _release(self, unit: WorkUnit) -> None:
        if self._plan.release is not None:
            self._plan.release(unit)

    def abandon(self, exc: BaseException | None = None) -> None:
        """Stop waiting for the units still running (the group remembers the busy ranks and
        says so in ``exc``) and release every unit not done."""
        running, self._running = self._running, {}
        for entry in running.values():
            give_up(self._group, entry.handle, exc)
            self._release(entry.unit)
        for queue in (*self._pinned.values(), self._free):
            while queue:
                self._release(queue.popleft())
