"""The worker's side of exactly-once replay: a journal of the calls a worker ran, by id.

A call of a group that uses call ids (:meth:`WorkerGroup.use_call_ids
<sc_core.WorkerGroup.use_call_ids>`) reaches each rank with its :class:`~sc_core.CallId`
under the reserved keyword :data:`CALL_ID_KWARG`. A backend runs every worker method through
:func:`run_journaled` (or :func:`run_journaled_async` in an async actor), which takes the id
out of the keyword arguments and, per worker instance (``worker.__dict__["_sc_journal"]``):

* **fences** older drivers: a call whose epoch is lower than the highest seen raises
  :class:`~sc_core.StaleDriverError`;
* answers a call whose ``(scope, key)`` it completed with the stored outcome (the value, or
  the exception raised again), waits for one still running and answers with its outcome,
  and otherwise runs it and stores the outcome (a ``BaseException`` that is not an
  ``Exception``, such as ``KeyboardInterrupt``, is not stored: the call may run again);
* keeps the outcomes of the newest scope seen and the one before (:data:`KEEP_SCOPES`), or,
  when the call says so (``CallId.keep_from``), of every scope from that one on;
* remembers, per method, the last call it completed (:class:`~sc_core.CallRecord`);
* reports every call it holds, running or finished, by id (:class:`~sc_core.JournaledCall`,
  :func:`journaled_calls`), and lets a caller wait until a call has reached it
  (:func:`await_journaled`).

A call that also carries :data:`JOURNAL_LANE_KWARG` (a re-attached driver sends it to a rank
whose journal holds the call: :meth:`WorkerGroup.adopt_journals
<sc_core.WorkerGroup.adopt_journals>`) is answered from the journal only: the stored
outcome, or that of the running original once it finishes; it never runs the method. A
backend runs such a call beside the rank's running call (on Ray, in the actor's control
concurrency group), so that a rank busy in a call whose peers never got it (a *torn* call)
still answers the calls it finished, and joins the running one instead of running it twice.

A call without an id runs as it is, at the cost of one dictionary lookup.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar, cast

from ._call_ids import CallId, CallRecord, CallState, JournaledCall
from ._errors import ConfigTypeError, StaleDriverError, WorkerGroupError

__all__ = [
    "CALL_ID_KWARG",
    "JOURNAL_ATTR",
    "JOURNAL_LANE_KWARG",
    "KEEP_SCOPES",
    "Journal",
    "await_journaled",
    "journal_of",
    "journaled_calls",
    "last_calls",
    "method_label",
    "run_journaled",
    "run_journaled_async",
]

logger = logging.getLogger("sc_core.journal")

T = TypeVar("T")

#: The keyword under which a call's id reaches a worker (taken out before the method runs).
CALL_ID_KWARG = "_sc_call_id"
#: The keyword that tells a worker to answer a call from its journal only (never run it).
JOURNAL_LANE_KWARG = "_sc_from_journal"
#: The attribute of a worker instance that holds its journal.
JOURNAL_ATTR = "_sc_journal"
#: How many scopes (steps) of outcomes a worker keeps: the newest seen and the one before.
KEEP_SCOPES = 2
#: How often an async call polls for the outcome of its running original (seconds, at most).
_ASYNC_POLL_S = 0.02


@dataclass(eq=False)
class _Entry:
    """One call in the journal: running until ``done`` (or ``abandoned``); ``epoch``,
    ``method`` and ``ranks`` as the call first came."""

    epoch: int = 0
    method: str = ""
    ranks: tuple[int, ...] | None = None
    done: bool = False
    abandoned: bool = False
    ok: bool = False
    value: Any = None
    error: BaseException | None = None
    traceback: TracebackType | None = field(default=None, repr=False)


def _rank_text(worker: object) -> str:
    rank = getattr(worker, "_rank", None)
    return f"rank {rank}" if isinstance(rank, int) else "rank ?"


class Journal:
    """The calls one worker instance ran, by ``(scope, key)`` (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.newest_epoch = 0
        self.newest_scope = 0
        #: the oldest scope the driver said it may replay (``CallId.keep_from``)
        self.keep_from = 0
        self._entries: dict[tuple[int, str], _Entry] = {}
        self._last: dict[str, CallRecord] = {}

    def claim(
        self, worker: object, method: str, call_id: CallId, may_own: bool = True
    ) -> tuple[_Entry, bool]:
        """The entry of ``call_id`` and whether the caller owns it (runs the method), after
        fencing and dropping old scopes. ``may_own=False`` (a call answered from the
        journal only): a :class:`~sc_core.WorkerGroupError` when the journal does not hold
        the call."""
        with self._cond:
            if call_id.epoch < self.newest_epoch:
                raise StaleDriverError(
                    f"{type(worker).__qualname__}.{method} ({_rank_text(worker)}): call "
                    f"{call_id.key!r} of step {call_id.scope} comes from driver epoch "
                    f"{call_id.epoch}, but epoch {self.newest_epoch} was seen: a newer driver "
                    "re-attached to this run"
                )
            self.newest_epoch = call_id.epoch
            oldest: int | None = None
            if call_id.keep_from is not None:
                if call_id.keep_from > self.keep_from:  # the driver's word, when it gives one
                    self.keep_from = oldest = call_id.keep_from
            elif call_id.scope > self.newest_scope:
                oldest = call_id.scope - (KEEP_SCOPES - 1)
            self.newest_scope = max(self.newest_scope, call_id.scope)
            if oldest is not None:
                for key in [k for k in self._entries if k[0] < oldest]:
                    del self._entries[key]
            key = (call_id.scope, call_id.key)
            entry = self._entries.get(key)
            if entry is not None:
                return entry, False
            if not may_own:
                raise WorkerGroupError(
                    f"{type(worker).__qualname__}.{method} ({_rank_text(worker)}): call "
                    f"{call_id.key!r} of step {call_id.scope} was sent to be answered from "
                    "this worker's journal, which does not hold it (it was never received, "
                    "was interrupted, or is older than the steps kept)"
                )
            entry = self._entries[key] = _Entry(call_id.epoch, method, call_id.ranks)
            self._cond.notify_all()  # a caller may wait for the call to arrive
            return entry, True

    def finish(
        self,
        method: str,
        call_id: CallId,
        entry: _Entry,
        value: Any = None,
        error: BaseException | None = None,
    ) -> None:
        """Store the outcome of an owned entry and wake its waiters."""
        with self._cond:
            entry.ok = error is None
            entry.value = value
            entry.error = error
            entry.traceback = None if error is None else error.__traceback__
            entry.done = True
            self._last[method] = CallRecord(call_id.epoch, call_id.scope, call_id.key, entry.ok)
            self._cond.notify_all()

    def abandon(self, call_id: CallId, entry: _Entry) -> None:
        """Forget an owned entry whose method ended without an outcome to store."""
        with self._cond:
            key = (call_id.scope, call_id.key)
            if self._entries.get(key) is entry:
                del self._entries[key]
            entry.abandoned = True
            self._cond.notify_all()

    def wait(self, entry: _Entry) -> None:
        """Block until ``entry`` is done or abandoned."""
        with self._cond:
            while not (entry.done or entry.abandoned):
                self._cond.wait()

    def last_calls(self) -> dict[str, CallRecord]:
        """Per method, the last call completed (a copy)."""
        with self._cond:
            return dict(self._last)

    def calls(self, scopes: frozenset[int] | None = None) -> list[JournaledCall]:
        """Every call held, running or finished, of ``scopes`` (``None``: of every scope
        kept), by scope and key."""
        with self._cond:
            held = [
                (scope, key, entry)
                for (scope, key), entry in self._entries.items()
                if scopes is None or scope in scopes
            ]
            return [
                JournaledCall(entry.epoch, scope, key, entry.method, _state(entry), entry.ranks)
                for scope, key, entry in sorted(held, key=lambda item: (item[0], item[1]))
            ]

    def await_call(self, scope: int, key: str, timeout: float | None) -> CallState | None:
        """Block until the call ``(scope, key)`` has reached this worker (running or
        finished), at most ``timeout`` seconds; its state, or ``None`` if it did not."""
        with self._cond:
            found = self._cond.wait_for(lambda: (scope, key) in self._entries, timeout)
            return _state(self._entries[(scope, key)]) if found else None


def _state(entry: _Entry) -> CallState:
    if not entry.done:
        return "running"
    return "ok" if entry.ok else "error"


_create_lock = threading.Lock()


def journal_of(worker: object) -> Journal:
    """``worker``'s journal, made on first use."""
    attributes: dict[str, Any] = worker.__dict__
    journal = attributes.get(JOURNAL_ATTR)
    if journal is None:
        with _create_lock:
            journal = attributes.setdefault(JOURNAL_ATTR, Journal())
    if not isinstance(journal, Journal):
        raise ConfigTypeError(
            f"{type(worker).__qualname__}: attribute {JOURNAL_ATTR!r} is reserved for sc's "
            f"call journal, got {type(journal).__qualname__}"
        )
    return journal


def last_calls(worker: object) -> dict[str, CallRecord]:
    """Per method, the last call ``worker`` completed with an id (empty without any)."""
    journal = getattr(worker, "__dict__", {}).get(JOURNAL_ATTR)
    return journal.last_calls() if isinstance(journal, Journal) else {}


def journaled_calls(worker: object, scopes: frozenset[int] | None = None) -> list[JournaledCall]:
    """Every call with an id ``worker`` holds, running or finished, of ``scopes``
    (``None``: every scope it keeps)."""
    journal = getattr(worker, "__dict__", {}).get(JOURNAL_ATTR)
    return journal.calls(scopes) if isinstance(journal, Journal) else []


def await_journaled(
    worker: object, scope: int, key: str, timeout: float | None
) -> CallState | None:
    """Wait until the call ``(scope, key)`` has reached ``worker`` (it runs, or ran), at most
    ``timeout`` seconds; its state, or ``None`` if it did not arrive."""
    return journal_of(worker).await_call(scope, key, timeout)


#: A fused worker's entry point: the method it runs is named by its first argument.
_FUSED_ENTRY = "_fuw_execute"


def method_label(method_name: str, args: tuple[Any, ...]) -> str:
    """The method a call runs: ``method_name``, or for a fused worker's ``_fuw_execute``
    the method its first argument names."""
    if method_name == _FUSED_ENTRY and args and isinstance(args[0], str):
        return args[0]
    return method_name


def _split(
    worker: object, method_name: str, kwargs: dict[str, Any]
) -> tuple[CallId | None, bool, dict[str, Any]]:
    """The call id, whether the call is answered from the journal only, and the method's
    own keyword arguments."""
    if CALL_ID_KWARG not in kwargs and JOURNAL_LANE_KWARG not in kwargs:
        return None, False, kwargs
    rest = dict(kwargs)
    call_id = rest.pop(CALL_ID_KWARG, None)
    from_journal = rest.pop(JOURNAL_LANE_KWARG, False)
    where = f"{type(worker).__qualname__}.{method_name} ({_rank_text(worker)})"
    if not isinstance(call_id, CallId):
        raise ConfigTypeError(
            f"{where}: keyword {CALL_ID_KWARG!r} is reserved for a sc_core.CallId, got "
            f"{type(call_id).__qualname__} {call_id!r}"
        )
    if not isinstance(from_journal, bool):
        raise ConfigTypeError(
            f"{where}: keyword {JOURNAL_LANE_KWARG!r} is reserved for a bool, got "
            f"{type(from_journal).__qualname__} {from_journal!r}"
        )
    return call_id, from_journal, rest


class _Run:
    """One call with an id on its way through :func:`run_journaled` or
    :func:`run_journaled_async`: claim it, answer it from the journal, store its outcome."""

    def __init__(
        self, worker: object, method_name: str, call_id: CallId, from_journal: bool
    ) -> None:
        self.worker = worker
        self.method_name = method_name
        self.call_id = call_id
        self.may_own = not from_journal
        self.journal = journal_of(worker)
        self.entry = _Entry()

    def claim(self) -> bool:
        """Whether this caller owns the call (runs the method); else :attr:`entry` is the
        call to wait for."""
        self.entry, owner = self.journal.claim(
            self.worker, self.method_name, self.call_id, may_own=self.may_own
        )
        return owner

    def answer(self) -> Any:
        """The outcome of the call, finished by another caller: its value, or its error
        raised again."""
        logger.debug("%s: %s answered from the journal", self.method_name, self.call_id)
        entry = self.entry
        if entry.error is not None:
            raise entry.error.with_traceback(entry.traceback)
        return entry.value

    def failed(self, exc: BaseException) -> None:
        """Store the error the owned call raised; a ``BaseException`` that is not an
        ``Exception`` (cancelled, interrupted) leaves no outcome to keep."""
        if isinstance(exc, Exception):
            self.journal.finish(self.method_name, self.call_id, self.entry, error=exc)
        else:
            self.journal.abandon(self.call_id, self.entry)

    def done(self, value: T) -> T:
        """Store the owned call's value, and return it."""
        self.journal.finish(self.method_name, self.call_id, self.entry, value=value)
        return value


def _start(
    worker: object, method_name: str, kwargs: dict[str, Any], args: tuple[Any, ...]
) -> tuple[_Run | None, dict[str, Any]]:
    """The journaled run of the call (``None`` for a call without an id) and the method's
    own keyword arguments."""
    call_id, from_journal, rest = _split(worker, method_name, kwargs)
    if call_id is None:
        return None, rest
    return _Run(worker, method_label(method_name, args), call_id, from_journal), rest


def run_journaled(
    worker: object,
    method_name: str,
    kwargs: dict[str, Any],
    run: Callable[[dict[str, Any]], T],
    args: tuple[Any, ...] = (),
) -> T:
    """``run(kwargs)`` exactly once per call id (see the module docstring), ``kwargs``
    without the id (``kwargs`` itself is not changed); a call sent to be answered from the
    journal (:data:`JOURNAL_LANE_KWARG`) never runs: the stored outcome, that of the running
    original, or a :class:`~sc_core.WorkerGroupError` when the journal does not hold it.
    ``args`` (the positional arguments) only name the method a fused worker's
    ``_fuw_execute`` runs, in records and errors."""
    call, rest = _start(worker, method_name, kwargs, args)
    if call is None:
        return run(rest)
    while not call.claim():
        call.journal.wait(call.entry)
        if call.entry.done:
            return cast(T, call.answer())
    try:
        value = run(rest)
    except BaseException as exc:
        call.failed(exc)
        raise
    return call.done(value)


async def run_journaled_async(
    worker: object,
    method_name: str,
    kwargs: dict[str, Any],
    run: Callable[[dict[str, Any]], Awaitable[T]],
    args: tuple[Any, ...] = (),
) -> T:
    """:func:`run_journaled` for an async actor: ``await run(kwargs)`` exactly once per call
    id; a duplicate of a running call polls (``asyncio.sleep``) without blocking the loop."""
    call, rest = _start(worker, method_name, kwargs, args)
    if call is None:
        return await run(rest)
    while not call.claim():
        delay = 0.001
        while not (call.entry.done or call.entry.abandoned):
            await asyncio.sleep(delay)
            delay = min(delay * 2, _ASYNC_POLL_S)
        if call.entry.done:
            return cast(T, call.answer())
    try:
        value = await run(rest)
    except BaseException as exc:
        call.failed(exc)
        raise
    return call.done(value)
