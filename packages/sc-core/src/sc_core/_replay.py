"""A re-attached driver's view of the workers' journals, and torn calls.

A driver killed while it hands a call to a group's ranks (after rank 0 got it, before rank 1
did) leaves a *torn* call: rank 0 runs it, maybe inside a collective that waits for rank 1
forever, and rank 1 never received it. A driver that re-attaches calls
:meth:`WorkerGroup.adopt_journals <sc_core.WorkerGroup.adopt_journals>` before anything
else: every live rank reports the calls of the replayed scopes its journal holds, running or
finished (on the control lane, ``_lanes.py``, so a busy rank answers at once), and the group
keeps a :class:`JournalView` of them. A call some ranks hold and others of the ranks it was
sent to never received is a :class:`TornCall`.

The torn call is completed by the replay itself, with the same id and the same arguments:
the replaying driver recomputes the step's calls deterministically (the same scope, the same
keys, the same data, as every replay), and the call path (``_units.start``) sends each call
with an id to every rank of the call, each rank on its lane: a rank whose journal holds the
call gets it on the control lane, answered from the journal (the stored outcome, or the
running original's once it ends: never run twice), and a rank that never received it gets
it on the main lane, where it runs. The missing rank joins the collective, the torn call
ends, and the earlier calls of the step were answered from the journals meanwhile, though
the busy rank's main lane was taken. No rank is taken as lost, no checkpoint restored.

For tests, :func:`arm_torn_dispatch` tears the next call on purpose: it is sent to its first
ranks only, and once they run it, a function of the test's runs (which kills the driver).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sc_dispatch import Execute

from ._backend import Backend, RankArgs
from ._call import Call
from ._call_ids import CallId, CallState, JournaledCall, check_count
from ._errors import ConfigTypeError, InvalidConfigError
from ._lanes import AWAIT_CALL_METHOD, JOURNAL_CALLS_METHOD, on_control_lane
from ._liveness import Liveness

__all__ = [
    "JOURNAL_ASK_TIMEOUT_S",
    "JournalView",
    "TornCall",
    "TornDispatch",
    "adopt_journals",
    "arm_torn_dispatch",
    "await_call",
    "check_scopes",
    "disarm_torn_dispatch",
    "take_torn_dispatch",
]

logger = logging.getLogger("sc_core.worker_group")

#: How long a driver waits for the ranks' journals (seconds): answered on the control lane,
#: at once however busy the rank is.
JOURNAL_ASK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TornCall:
    """A call that some ranks of group ``group`` hold and others it was sent to never
    received: ``held`` the state of the call on each rank that has it (``"running"``,
    ``"ok"`` or ``"error"``), ``missing`` the live ranks that never got it. The replay of
    its step sends it again, with the same id, to every rank: the ranks in ``held`` answer
    from their journals (joining the running original), those in ``missing`` run it."""

    group: str
    scope: int
    key: str
    method: str
    held: Mapping[int, CallState] = field(hash=False)
    missing: tuple[int, ...]

    def __str__(self) -> str:
        by_state: dict[str, list[int]] = {}
        for rank, state in sorted(self.held.items()):
            by_state.setdefault(state, []).append(rank)
        held = ", ".join(f"{state} on ranks {ranks}" for state, ranks in sorted(by_state.items()))
        return (
            f"group {self.group!r}: {self.method} (call {self.key!r} of step {self.scope}) is "
            f"torn: {held}; never received by ranks {list(self.missing)}"
        )


class JournalView:
    """Which live ranks' journals hold which calls, by ``(scope, key)``, as a re-attached
    driver asked them (:func:`adopt_journals`). The call path sends a call with an id to a
    rank that holds it on the control lane, answered from the journal."""

    def __init__(self, held: Mapping[tuple[int, str], Iterable[int]]) -> None:
        self._held = {k: frozenset(v) for k, v in held.items()}
        self._lock = threading.Lock()

    def holds(self, rank: int, call_id: CallId) -> bool:
        """Whether ``rank``'s journal held the call ``call_id`` names."""
        ranks = self._held.get((call_id.scope, call_id.key))
        return ranks is not None and rank in ranks

    def drop_ranks(self, ranks: Iterable[int]) -> None:
        """Forget what ``ranks`` held: their workers were replaced (a new worker's
        journal is empty)."""
        gone = frozenset(ranks)
        with self._lock:
            self._held = {k: v - gone for k, v in self._held.items() if v - gone}

    def __len__(self) -> int:
        return len(self._held)

    def __repr__(self) -> str:
        return f"<JournalView of {len(self._held)} calls>"


class _Site(Protocol):
    """What adopting the journals uses of a worker group."""

    name_prefix: str

    @property
    def world_size(self) -> int: ...

    @property
    def _sc_runtime(self) -> _Runtime: ...

    def _sc_backend(self, method_name: str) -> Backend: ...

    def check_worker_aliveness(self) -> list[int]: ...


class _Runtime(Protocol):
    liveness: Liveness
    journals: JournalView | None


def check_scopes(where: str, scopes: Iterable[int] | None) -> frozenset[int] | None:
    """``scopes`` as a frozenset of ints >= 0 (``None`` stays ``None``); a typed error
    naming ``where`` and the value otherwise."""
    if scopes is None:
        return None
    if isinstance(scopes, (str, bytes)) or not isinstance(scopes, Iterable):
        raise ConfigTypeError(
            f"{where}: scopes must be an iterable of ints >= 0 or None, got "
            f"{type(scopes).__qualname__} {scopes!r}"
        )
    return frozenset(check_count(where, "scopes[...]", s) for s in scopes)


def _ask(
    group: str,
    backend: Backend,
    method: str,
    ranks: tuple[int, ...],
    args: tuple[Any, ...],
    timeout: float,
) -> list[Any]:
    """``method(*args)`` on ``ranks`` through the backend (a framework query: the control
    lane), waited for within ``timeout`` seconds."""
    call = Call(
        group=group,
        method_name=method,
        ranks=ranks,
        execute_mode=Execute.ALL,
        blocking=True,
        timeout=timeout,
    )
    rank_args: list[RankArgs] = [(args, {}) for _ in ranks]
    try:
        values = backend.wait(backend.start(call, method, rank_args))
    except BaseException as exc:
        call.span.finish(exc)
        raise
    call.span.finish(None)
    return values


def adopt_journals(site: _Site, scopes: Iterable[int]) -> list[TornCall]:
    """See :meth:`WorkerGroup.adopt_journals <sc_core.WorkerGroup.adopt_journals>`."""
    where = f"{type(site).__name__} {site.name_prefix!r}.adopt_journals"
    wanted = check_scopes(where, scopes)
    if wanted is None:
        raise ConfigTypeError(f"{where}: scopes must be an iterable of ints >= 0, got None")
    runtime = site._sc_runtime
    site.check_worker_aliveness()  # a dead rank is not asked: it is recovered, not completed
    dead = set(runtime.liveness.dead_ranks())
    live = tuple(r for r in range(site.world_size) if r not in dead)
    if not live:
        runtime.journals = JournalView({})
        return []
    backend = site._sc_backend(JOURNAL_CALLS_METHOD)
    answers = _ask(
        site.name_prefix, backend, JOURNAL_CALLS_METHOD, live, (wanted,), JOURNAL_ASK_TIMEOUT_S
    )
    held: dict[tuple[int, str], dict[int, JournaledCall]] = {}
    for rank, calls in zip(live, answers, strict=True):
        for call in calls:
            held.setdefault((call.scope, call.key), {})[rank] = call
    runtime.journals = JournalView({k: v.keys() for k, v in held.items()})
    torn = []
    for (scope, key), by_rank in sorted(held.items()):
        first = next(iter(by_rank.values()))
        targets = first.ranks if first.ranks is not None else tuple(range(site.world_size))
        missing = tuple(r for r in targets if r in live and r not in by_rank)
        if missing:
            held_states = {r: c.state for r, c in sorted(by_rank.items())}
            torn.append(TornCall(site.name_prefix, scope, key, first.method, held_states, missing))
    for call in torn:
        logger.warning(
            "%s; the replay sends it to every rank with the same id: the ranks that hold it "
            "answer from their journals, the others run it",
            call,
        )
    return torn


# --- tearing a call on purpose (tests) --------------------------------------------------


@dataclass(frozen=True)
class TornDispatch:
    """An armed torn dispatch (:func:`arm_torn_dispatch`)."""

    then: Callable[[], object]
    reach: int
    timeout_s: float


_armed: TornDispatch | None = None
_armed_lock = threading.Lock()


def arm_torn_dispatch(
    then: Callable[[], object], *, reach: int = 1, timeout_s: float = 60.0
) -> None:
    """For testing a driver killed while it hands out a call: the next call with an id
    (of a group that uses call ids) that starts on more than ``reach`` ranks, a framework
    query excepted, is sent to its first ``reach`` ranks only; once each of them has it
    (running, or finished: its journal says so, asked on the control lane; at most
    ``timeout_s`` seconds), ``then()`` runs on the calling thread. A test's ``then`` kills
    the driver (SIGKILL); if it returns, the call raises
    :class:`~sc_core.InjectedFaultError` (the ranks it reached are left running it, as
    busy ranks). Arming again replaces the armed one; one call fires it, once."""
    global _armed
    if not callable(then):
        raise ConfigTypeError(
            f"arm_torn_dispatch: then must be callable, got {type(then).__qualname__} {then!r}"
        )
    if isinstance(reach, bool) or not isinstance(reach, int) or reach < 1:
        raise InvalidConfigError(f"arm_torn_dispatch: reach must be an int >= 1, got {reach!r}")
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, (int, float))
        or not math.isfinite(timeout_s)
        or timeout_s <= 0
    ):
        raise InvalidConfigError(
            f"arm_torn_dispatch: timeout_s must be a positive finite number, got {timeout_s!r}"
        )
    with _armed_lock:
        _armed = TornDispatch(then, reach, float(timeout_s))


def disarm_torn_dispatch() -> bool:
    """Disarm :func:`arm_torn_dispatch`; whether one was armed (and had not fired)."""
    global _armed
    with _armed_lock:
        armed, _armed = _armed, None
    return armed is not None


def take_torn_dispatch(
    call: Call, method_name: str, rank_args: Sequence[RankArgs]
) -> TornDispatch | None:
    """The armed torn dispatch, disarmed, if ``call`` is the one it tears (see
    :func:`arm_torn_dispatch`); else ``None``. Every call asks: nothing armed costs one
    global read."""
    global _armed
    armed = _armed
    if armed is None or call.call_id is None or len(call.ranks) <= armed.reach:
        return None
    args = rank_args[0][0] if rank_args else ()
    if on_control_lane(method_name, args, {}):
        return None
    with _armed_lock:
        if _armed is not armed:
            return None
        _armed = None
    return armed


def await_call(
    group: str,
    backend: Backend,
    ranks: tuple[int, ...],
    call_id: CallId,
    timeout: float,
) -> list[CallState | None]:
    """Per rank of ``ranks`` of group ``group``, the state of the call ``call_id`` once it
    reached the rank's journal, or ``None`` if it did not within ``timeout`` seconds."""
    args = (call_id.scope, call_id.key, timeout)
    states: list[CallState | None] = _ask(
        group, backend, AWAIT_CALL_METHOD, ranks, args, timeout + JOURNAL_ASK_TIMEOUT_S
    )
    return states
