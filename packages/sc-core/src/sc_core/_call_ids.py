"""Call ids, the driver's side of exactly-once replay (the worker's side is ``_journal.py``).

A driver that re-attaches to live workers after the previous driver died replays the
interrupted step from its start. Each call then carries a deterministic :class:`CallId`
(driver epoch, step scope, a key counted per method), so that a worker that already ran the
call answers with its stored outcome instead of running it again. :class:`CallIds` is the
driver's allocator, handed to :meth:`WorkerGroup.use_call_ids <sc_core.WorkerGroup.use_call_ids>`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

from ._errors import ConfigTypeError, InvalidConfigError

__all__ = [
    "CALL_STATES",
    "CallId",
    "CallIds",
    "CallRecord",
    "CallState",
    "JournaledCall",
    "check_count",
]

#: Where a call stands in a worker's journal: started and not finished, returned, raised.
CallState = Literal["running", "ok", "error"]
#: Every :data:`CallState`.
CALL_STATES: tuple[CallState, ...] = ("running", "ok", "error")


def check_count(where: str, name: str, value: object) -> int:
    """``value`` if it is an int >= 0 (not a bool), else a typed error naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(
            f"{where}: {name} must be an int >= 0, got {type(value).__qualname__} {value!r}"
        )
    if value < 0:
        raise InvalidConfigError(f"{where}: {name} must be an int >= 0, got {value!r}")
    return value


def _check_name(where: str, name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigTypeError(
            f"{where}: {name} must be a non-empty str, got {type(value).__qualname__} {value!r}"
        )
    if not value:
        raise InvalidConfigError(f"{where}: {name} must be a non-empty str, got {value!r}")
    return value


@dataclass(frozen=True)
class CallId:
    """The id of one call: ``epoch`` the driver generation (a re-attached driver has a
    higher one), ``scope`` the step it belongs to, ``key`` the call within the step
    (``"update_actor#0"``). A worker keys what it ran by ``(scope, key)``: the same call
    replayed by a newer driver has the same scope and key. ``keep_from``: the oldest scope
    whose outcomes the driver may still replay (the worker drops older ones); ``None``: the
    worker keeps the newest scope it saw and the one before. ``ranks``: the ranks the call
    is sent to, set by the call path as it starts the call (:meth:`sent_to`), so that a
    journal knows which ranks a call should reach (a rank that has it, beside one that
    never got it, is a torn call: :meth:`WorkerGroup.adopt_journals
    <sc_core.WorkerGroup.adopt_journals>`)."""

    epoch: int
    scope: int
    key: str
    keep_from: int | None = None
    ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_count("CallId", "epoch", self.epoch)
        check_count("CallId", "scope", self.scope)
        _check_name("CallId", "key", self.key)
        if self.keep_from is not None:
            check_count("CallId", "keep_from", self.keep_from)
        if self.ranks is not None:
            if not isinstance(self.ranks, tuple):
                raise ConfigTypeError(
                    f"CallId: ranks must be a tuple of ints >= 0 or None, got "
                    f"{type(self.ranks).__qualname__} {self.ranks!r}"
                )
            for rank in self.ranks:
                check_count("CallId", "ranks[...]", rank)

    def unit(self, index: int) -> CallId:
        """The id of unit ``index`` of this call (a free unit of a load-balanced call)."""
        return CallId(self.epoch, self.scope, f"{self.key}/u{index}", self.keep_from)

    def sent_to(self, ranks: tuple[int, ...]) -> CallId:
        """This id, saying that the call is sent to ``ranks``."""
        return replace(self, ranks=tuple(ranks))


@dataclass(frozen=True)
class CallRecord:
    """The last call a worker completed for one method (:meth:`WorkerGroup.last_calls
    <sc_core.WorkerGroup.last_calls>`): its id's parts and whether it returned (``ok``) or
    raised."""

    epoch: int
    scope: int
    key: str
    ok: bool


@dataclass(frozen=True)
class JournaledCall:
    """One call in a worker's journal (:meth:`WorkerGroup.journaled_calls
    <sc_core.WorkerGroup.journaled_calls>`): its id's parts as the worker first received it
    (``epoch`` the driver that sent it first), ``method`` the name the worker runs,
    ``state`` whether it is still ``"running"`` (started, not finished) or returned
    (``"ok"``) or raised (``"error"``), and ``ranks`` the ranks its driver sent it to
    (``None``: not said)."""

    epoch: int
    scope: int
    key: str
    method: str
    state: CallState
    ranks: tuple[int, ...] | None = None

    @property
    def done(self) -> bool:
        """Whether the call finished (returned or raised)."""
        return self.state != "running"


class CallIds:
    """The driver's allocator of :class:`CallId` (thread-safe).

    ``begin(step)`` at the start of each step; every call of a bound method of a group that
    uses it (:meth:`WorkerGroup.use_call_ids <sc_core.WorkerGroup.use_call_ids>`) then takes
    :meth:`next`, ``CallId(epoch, step, "method#n")`` with ``n`` counted from 0 per (scope,
    group, method). A re-attached driver makes ``CallIds(epoch=old + 1)``, calls
    ``begin(step)`` with the interrupted step and replays it in the same order: the ids
    repeat, and the workers answer with the stored outcomes. ``with ids.scope(n):`` issues
    ids of an earlier step for a while (re-issuing a call launched then); the current scope
    is shared by every thread using the allocator.

    Counters of scopes older than the previous one are dropped on :meth:`begin` (the
    workers keep no older outcomes either). A driver that may replay older scopes (a call
    launched in one step and taken in a later one) says so with :meth:`retain_from`: the
    ids then carry that scope as ``keep_from``, and workers keep every outcome from it on.
    """

    def __init__(self, epoch: int = 0) -> None:
        self._epoch = check_count("CallIds", "epoch", epoch)
        self._scope = 0
        self._keep_from: int | None = None
        self._counts: dict[tuple[int, str, str], int] = {}
        self._lock = threading.Lock()

    @property
    def epoch(self) -> int:
        """The driver generation this allocator issues ids for."""
        return self._epoch

    @property
    def current_scope(self) -> int:
        """The scope (step) of the ids :meth:`next` issues now."""
        return self._scope

    def begin(self, scope: int) -> None:
        """Issue ids of ``scope`` (a step number >= 0) from now on."""
        check_count("CallIds.begin", "scope", scope)
        with self._lock:
            self._scope = scope
            oldest = scope - 1 if self._keep_from is None else min(scope - 1, self._keep_from)
            stale = [k for k in self._counts if k[0] < oldest]
            for k in stale:
                del self._counts[k]

    @property
    def keep_from(self) -> int | None:
        """The oldest scope the workers keep outcomes of (``None``: the default two)."""
        return self._keep_from

    def retain_from(self, scope: int | None) -> None:
        """From now on, ids tell the workers to keep the outcomes of ``scope`` and every
        later one, and drop older ones (``None``: back to the newest two scopes)."""
        if scope is not None:
            check_count("CallIds.retain_from", "scope", scope)
        with self._lock:
            self._keep_from = scope

    @contextlib.contextmanager
    def scope(self, scope: int) -> Iterator[None]:
        """Issue ids of ``scope`` inside the ``with`` block, then the previous scope again
        (its counters continue where they were)."""
        check_count("CallIds.scope", "scope", scope)
        with self._lock:
            previous, self._scope = self._scope, scope
        try:
            yield
        finally:
            with self._lock:
                self._scope = previous

    def next(self, group: str, method: str) -> CallId:
        """The next id of ``method`` called through group ``group`` in the current scope."""
        _check_name("CallIds.next", "group", group)
        _check_name("CallIds.next", "method", method)
        with self._lock:
            scope = self._scope
            counter = (scope, group, method)
            n = self._counts.get(counter, 0)
            self._counts[counter] = n + 1
            keep_from = self._keep_from
        return CallId(self._epoch, scope, f"{method}#{n}", keep_from)

    def __repr__(self) -> str:
        return f"CallIds(epoch={self._epoch}, current_scope={self._scope})"
