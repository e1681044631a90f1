"""The units of one call in flight: started, waited for, handed back (``_call_path.py``'s
step 2 and 3).

:class:`Units` starts every pinned unit of a :class:`~sc_dispatch.ext.WorkPlan` at once, in
one :meth:`~sc_core.Backend.start` over all their ranks, and gives free units to slots as
they become idle (``_slots.py`` says which). A blocking call takes :meth:`Units.outputs`
(one wait when every unit is pinned), a non-blocking one :meth:`Units.pending` (the
backend's futures), a stream iterates it. A failure gives up on the ranks still running
(:func:`give_up`): the group remembers them as busy, and the error says so.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sc_dispatch.ext import WorkPlan, WorkUnit

from ._backend import Backend, CallHandle, RankArgs
from ._busy import describe_busy
from ._call import Call
from ._call_ids import CallIds
from ._errors import (
    CallTimeoutError,
    InjectedFaultError,
    UnsupportedCallError,
    WorkerDiedError,
    WorkerError,
    WorkerGroupError,
)
from ._journal import CALL_ID_KWARG, JOURNAL_LANE_KWARG
from ._replay import TornDispatch, await_call, take_torn_dispatch
from ._runtime import GroupRuntime
from ._slots import SlotSpeeds

__all__ = [
    "CallSite",
    "StreamingBackend",
    "Units",
    "add_note",
    "check_non_blocking",
    "give_up",
    "start",
    "wait",
]

logger = logging.getLogger("sc_core.worker_group")

#: How often a backend without ``wait_any`` is polled for finished units (seconds).
_POLL_S = 0.002


class CallSite(Protocol):
    """What a call needs of its worker group (every :class:`~sc_core.WorkerGroup` is one)."""

    name_prefix: str
    default_timeout: float | None
    _sc_runtime: GroupRuntime
    _sc_call_ids: CallIds | None

    @property
    def world_size(self) -> int: ...

    def _sc_backend(self, method_name: str) -> Backend: ...


@runtime_checkable
class StreamingBackend(Protocol):
    """A backend that can wait for the first of several rank calls (optional, beside
    :class:`~sc_core.Backend`; without it a call with free units polls ``is_done``)."""

    def wait_any(self, rank_handles: Sequence[Any], timeout: float | None) -> list[int]:
        """Positions in ``rank_handles`` of the calls that have finished (value or error),
        at least one unless ``timeout`` seconds pass first (then possibly none)."""
        ...


def start(
    site: CallSite,
    call: Call,
    method_name: str,
    rank_args: list[RankArgs],
    backend: Backend,
    check_alive: bool = True,
) -> CallHandle:
    """Start ``method_name`` on the call's ranks (dead ranks refused first, unless
    ``check_alive`` is false: verl's ``execute_*_async`` start regardless). A call with an
    id passes it to every rank under :data:`~sc_core._journal.CALL_ID_KWARG`, saying which
    ranks it goes to (:meth:`CallId.sent_to <sc_core.CallId.sent_to>`); a rank whose journal
    held the call when a re-attached driver asked (``_replay.py``) gets it to be answered
    from the journal (:data:`~sc_core._journal.JOURNAL_LANE_KWARG`: the backend's control
    lane, beside the rank's running call)."""
    runtime = site._sc_runtime
    if check_alive:
        runtime.liveness.check_alive(call)
    call_id = call.call_id
    if call_id is not None:
        sent = call_id.sent_to(call.ranks)
        view = runtime.journals
        rank_args = [
            (
                args,
                {**kwargs, CALL_ID_KWARG: sent, JOURNAL_LANE_KWARG: True}
                if view is not None and view.holds(rank, call_id)
                else {**kwargs, CALL_ID_KWARG: sent},
            )
            for rank, (args, kwargs) in zip(call.ranks, rank_args, strict=True)
        ]
        torn = take_torn_dispatch(call, method_name, rank_args)
        if torn is not None:
            _tear(site, call, method_name, rank_args, backend, torn)
    handle = backend.start(call, method_name, rank_args)
    if len(handle.rank_handles) != len(call.ranks):
        raise WorkerGroupError(
            f"{type(site).__name__}.{method_name}: the backend started "
            f"{len(handle.rank_handles)} rank calls for ranks {list(call.ranks)}"
        )
    return handle


def _tear(
    site: CallSite,
    call: Call,
    method_name: str,
    rank_args: list[RankArgs],
    backend: Backend,
    torn: TornDispatch,
) -> None:
    """An injected torn dispatch (``_replay.arm_torn_dispatch``): the call starts on its
    first ``torn.reach`` ranks only; once they have it, ``torn.then()`` (a test kills the
    driver there); then the call raises :class:`~sc_core.InjectedFaultError`."""
    call_id = call.call_id
    if call_id is None:  # take_torn_dispatch tears calls with an id only
        return
    reached = call.ranks[: torn.reach]
    handle = backend.start(call.part(reached), method_name, rank_args[: torn.reach])
    states = await_call(site.name_prefix, backend, reached, call_id, torn.timeout_s)
    logger.warning(
        "worker group %s: injected torn dispatch: %s (call %r of step %d) sent to ranks %s "
        "of %s (%s there), never to the others",
        site.name_prefix,
        method_name,
        call_id.key,
        call_id.scope,
        list(reached),
        list(call.ranks),
        ", ".join(str(s) for s in states),
    )
    torn.then()
    exc = InjectedFaultError(
        f"{type(site).__name__} {site.name_prefix!r}.{method_name}: injected torn dispatch: "
        f"call {call_id.key!r} of step {call_id.scope} was sent to ranks {list(reached)} of "
        f"{list(call.ranks)} only"
    )
    give_up(site, handle, backend, exc)
    raise exc


def wait(site: CallSite, handle: CallHandle, backend: Backend) -> list[Any]:
    """The call's values; on a failure the group gives up on the ranks still running it."""
    call = handle.call
    try:
        outputs = backend.wait(handle)
    except (CallTimeoutError, WorkerDiedError, WorkerError) as exc:
        if isinstance(exc, WorkerDiedError):
            reason = f"{exc.reason} during {call.method_name}" if exc.reason else ""
            site._sc_runtime.liveness.mark_dead(
                exc.ranks, reason or f"died during {call.method_name}"
            )
        give_up(site, handle, backend, exc)
        raise
    if len(outputs) != len(call.ranks):
        raise WorkerGroupError(
            f"{type(site).__name__}: the backend returned {len(outputs)} values for ranks "
            f"{list(call.ranks)} of {call.method_name}"
        )
    return outputs


def give_up(
    site: CallSite, handle: CallHandle, backend: Backend, exc: BaseException | None
) -> None:
    """Stop waiting for a call: cancel what the backend can, remember the ranks still
    running it, and say so in ``exc``'s message (if any)."""
    call = handle.call
    busy = site._sc_runtime.liveness.busy
    for rank, rank_handle in zip(call.ranks, handle.rank_handles, strict=False):
        if not backend.is_done(rank_handle):
            busy.record(rank, call.method_name, rank_handle, backend.cancel(rank_handle))
    still = busy.current(backend.is_done, call.ranks)
    if still:
        if exc is not None:
            add_note(exc, f"Ranks {sorted(still)} are {describe_busy(still)}.")
        logger.warning(
            "worker group %s: %s: ranks %s %s",
            site.name_prefix,
            call.method_name,
            sorted(still),
            describe_busy(still),
        )


def check_non_blocking(plan: WorkPlan, where: str) -> None:
    """Refuse a non-blocking call of ``plan``, before anything starts, when the driver must
    schedule its units (free units) or a router must hear when each finishes; its units
    are released."""
    if all(u.slot is not None for u in plan.units) and plan.release is None:
        return
    for unit in plan.units:
        if plan.release is not None:
            plan.release(unit)
    raise UnsupportedCallError(
        f"{where}: {plan.mode} schedules its units from the driver and has no non-blocking "
        "form; call it blocking, or stream it with .stream(...)"
    )


def add_note(exc: BaseException, note: str) -> None:
    """Append ``note`` to ``exc``'s message (Python 3.10 has no ``add_note``)."""
    if note in str(exc):
        return
    first = str(exc.args[0]) if exc.args else ""
    exc.args = (f"{first}\n{note}" if first else note, *exc.args[1:])


@dataclass
class _Running:
    unit: WorkUnit
    slot: int
    handle: CallHandle


class Units:
    """The units of one call in flight (see the module docstring). Iterate it for
    ``(unit, output)`` in completion order (output without its padding rows; row units of
    padding only are skipped), or take :meth:`outputs` or :meth:`pending`."""

    def __init__(
        self,
        site: CallSite,
        call: Call,
        plan: WorkPlan,
        method_name: str,
        backend: Backend,
        check_alive: bool = True,
    ) -> None:
        self._site, self._call, self._plan = site, call, plan
        self._method, self._backend = method_name, backend
        pinned = [u for u in plan.units if u.slot is not None]
        self._free = collections.deque(u for u in plan.units if u.slot is None)
        self._untracked: list[WorkUnit] = []
        self._started_at = 0.0
        self._iterated = False
        self.finished = False
        # what following units one by one needs (a stream, free units): made on first use
        self._running: dict[int, list[_Running]] = {}
        self._done: collections.deque[tuple[WorkUnit, Any]]
        self._raw: dict[int, Any]
        self._speeds: SlotSpeeds
        try:
            self._pinned = self._start_pinned(pinned, check_alive) if pinned else None
        except BaseException:
            for unit in plan.units:
                self._release(unit)
            raise

    @property
    def plan(self) -> WorkPlan:
        return self._plan

    def _start_pinned(self, pinned: list[WorkUnit], check_alive: bool) -> CallHandle:
        """Start every pinned unit in one backend call over all their ranks."""
        plan = self._plan
        by_rank: dict[int, RankArgs] = {}
        for unit in pinned:
            index = unit.slot or 0
            by_rank.update(
                zip(plan.slots[index].ranks, plan.rank_arguments(unit, index), strict=True)
            )
        ranks = tuple(sorted(by_rank))
        call = self._call if ranks == self._call.ranks else self._call.part(ranks)
        rank_args = [by_rank[r] for r in ranks]
        handle = start(self._site, call, self._method, rank_args, self._backend, check_alive)
        self._started_at = time.monotonic()
        self._untracked = pinned
        return handle

    def _track_pinned(self) -> None:
        """Follow the pinned units one by one (a stream, or free units beside them): each
        gets the part of the one start's handle that holds its slot's ranks. A blocking call
        with pinned units only never needs it: it waits for the whole handle once."""
        if not self._running:
            self._running = {i: [] for i in range(len(self._plan.slots))}
            self._done, self._raw, self._speeds = collections.deque(), {}, SlotSpeeds()
        if not self._untracked or self._pinned is None:
            return
        handle, slots = self._pinned, self._plan.slots
        position = {rank: i for i, rank in enumerate(handle.call.ranks)}
        for unit in self._untracked:
            index = unit.slot or 0
            mine = slots[index].ranks
            part = CallHandle(
                handle.call.part(mine), [handle.rank_handles[position[r]] for r in mine]
            )
            self._running[index].append(_Running(unit, index, part))
            self._speeds.started(index, self._started_at)
        self._untracked = []

    def outputs(self) -> list[Any]:
        """Every unit's output, in unit order, padding included: one wait when every unit
        is pinned, else units run (free ones on idle slots) until all are done."""
        plan = self._plan
        if self._pinned is not None and not self._free and not self._iterated:
            values = wait(self._site, self._pinned, self._backend)
            by_rank = dict(zip(self._pinned.call.ranks, values, strict=True))
            if plan.release is not None:
                for unit in plan.units:
                    plan.release(unit)
            self.finished = True
            return [by_rank[plan.slots[u.slot or 0].collect_rank] for u in plan.units]
        for _ in self:
            pass
        return [self._raw[u.index] for u in plan.units]

    def handles(self) -> list[Any]:
        """The backend's handle of every rank the pinned units started on, in rank order
        (verl's ``execute_all_async`` returns them)."""
        return [] if self._pinned is None else list(self._pinned.rank_handles)

    def pending(self) -> list[Any]:
        """The backend's futures of every unit (a non-blocking call, which
        :func:`check_non_blocking` allowed)."""
        plan = self._plan
        if self._pinned is None:
            return []
        futures = dict(
            zip(self._pinned.call.ranks, self._backend.pending(self._pinned), strict=True)
        )
        self.finished = True
        return [futures[plan.slots[u.slot or 0].collect_rank] for u in plan.units]

    def __iter__(self) -> Units:
        return self

    def __next__(self) -> tuple[WorkUnit, Any]:
        self._iterated = True
        self._track_pinned()
        while True:
            while self._done:
                unit, output = self._done.popleft()
                if unit.rows or not self._plan.joins_in_order:
                    return unit, output
            try:
                self._fill()
            except BaseException as exc:
                self.abandon(exc)
                raise
            if not any(self._running.values()):
                self.finished = True
                raise StopIteration
            self._wait_some()

    def _fill(self) -> None:
        """Give every idle slot a free unit (unless the others will finish the rest
        sooner), and a second one to slots that keep up."""
        slots, speeds, free = len(self._plan.slots), self._speeds, self._free
        for index in range(slots):
            if free and not self._running[index] and not self._idle_is_better(index):
                self._launch(free.popleft(), index)
        for index in range(slots):
            if len(free) >= slots and len(self._running[index]) == 1 and speeds.keeps_up(index):
                self._launch(free.popleft(), index)

    def _idle_is_better(self, index: int) -> bool:
        queued = [
            sum(len(r.unit.rows) + r.unit.pad for r in self._running[i])
            for i in range(len(self._plan.slots))
        ]
        rows_left = sum(len(u.rows) + u.pad for u in self._free)
        first = self._free[0]
        return self._speeds.worth_waiting_for(index, queued, rows_left, len(first.rows) + first.pad)

    def _launch(self, unit: WorkUnit, index: int) -> None:
        slot = self._plan.slots[index]
        part = self._call.part(slot.ranks, unit=unit.index)
        rank_args = self._plan.rank_arguments(unit, index)
        handle = start(self._site, part, self._method, rank_args, self._backend)
        if not self._running[index]:
            self._speeds.started(index)
        self._running[index].append(_Running(unit, index, handle))

    def _finished(self) -> list[_Running]:
        """Running units with a finished rank call (waited for within the deadline)."""
        entries = [r for queue in self._running.values() for r in queue]
        handles = [h for r in entries for h in r.handle.rank_handles]
        owners = [r for r in entries for _ in r.handle.rank_handles]
        call = self._call
        wait_any = getattr(self._backend, "wait_any", None)
        while True:
            if wait_any is not None:
                done = wait_any(handles, call.remaining())
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
                values = wait(self._site, running.handle, self._backend)
                self._complete(running, values)
        except BaseException as exc:
            self.abandon(exc)
            raise

    def _complete(self, running: _Running, values: list[Any]) -> None:
        index, unit = running.slot, running.unit
        self._running[index].remove(running)
        self._speeds.finished(index, len(unit.rows) + unit.pad)
        self._release(unit)
        slot = self._plan.slots[index]
        output = values[slot.ranks.index(slot.collect_rank)]
        self._raw[unit.index] = output
        self._done.append((unit, self._plan.trim(unit, output)))

    def _release(self, unit: WorkUnit) -> None:
        if self._plan.release is not None:
            self._plan.release(unit)

    def abandon(self, exc: BaseException | None = None) -> None:
        """Stop waiting for the units still running (the group remembers the busy ranks and
        says so in ``exc``) and release every unit not done."""
        self._track_pinned()
        running = [r for queue in self._running.values() for r in queue]
        for queue in self._running.values():
            queue.clear()
        for entry in running:
            give_up(self._site, entry.handle, self._backend, exc)
            self._release(entry.unit)
        while self._free:
            self._release(self._free.popleft())
