"""Call spans: the time and bytes of each phase of each worker-group call.

Every call on a bound method records a :class:`CallSpan` with the phases ``dispatch``,
``execute`` (the driver submitting the call), ``wait`` (blocking calls only) and ``collect``,
each a :class:`PhaseRecord` with ``rank=None``; a backend adds per-rank ``execute`` records
(``rank=r``) when it knows when each worker ran, and reports the bytes the driver put and
fetched with :meth:`CallSpan.add_bytes`. When a call ends (returns or raises) its span is
passed to every observer added with :func:`add_span_observer`. :class:`SpanRecorder` is such
an observer: it keeps the spans and writes a Chrome/Perfetto trace and a per-method summary.

:func:`driver_span` records a span of the driver's own around several calls (one weight
sync, say, made of calls on two groups), with the single phase ``run``: the trace shows the
operation as one bar above the calls it made.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._errors import InvalidConfigError

__all__ = [
    "CallSpan",
    "PhaseRecord",
    "PhaseStats",
    "SpanObserver",
    "SpanRecorder",
    "add_span_observer",
    "driver_span",
    "remove_span_observer",
]

logger = logging.getLogger("sc_core.spans")

#: The driver-side phases of a call, in order.
PHASES = ("dispatch", "execute", "wait", "collect")
#: The one phase of a :func:`driver_span`.
RUN_PHASE = "run"

_call_ids = itertools.count(1)


@dataclass(frozen=True)
class PhaseRecord:
    """One phase of one call: ``start``/``end`` in seconds since the epoch (``time.time``),
    ``rank=None`` for the driver, else the worker rank it ran on."""

    name: str
    start: float
    end: float
    rank: int | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class CallSpan:
    """Everything recorded about one call. Backends add to it; observers read it."""

    group: str
    method: str
    blocking: bool
    ranks: tuple[int, ...]
    call_id: int = field(default_factory=lambda: next(_call_ids))
    start: float = field(default_factory=time.time)
    end: float | None = None
    phases: list[PhaseRecord] = field(default_factory=list)
    bytes_put: int = 0
    bytes_fetched: int = 0
    error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def recording(self) -> bool:
        """Whether this span records (``False`` for the shared span of unobserved calls)."""
        return True

    @contextlib.contextmanager
    def phase(self, name: str, rank: int | None = None) -> Iterator[None]:
        """Record the time spent in the ``with`` block as phase ``name``."""
        start = time.time()
        try:
            yield
        finally:
            self.add_phase(name, start, time.time(), rank)

    def add_phase(self, name: str, start: float, end: float, rank: int | None = None) -> None:
        """Record a phase measured elsewhere (a backend reporting when a rank ran)."""
        with self._lock:
            self.phases.append(PhaseRecord(name, start, end, rank))

    def add_bytes(self, put: int = 0, fetched: int = 0) -> None:
        """Count bytes the driver sent to workers (``put``) and received (``fetched``)."""
        with self._lock:
            self.bytes_put += put
            self.bytes_fetched += fetched

    def duration(self, name: str) -> float | None:
        """Total driver-side time in phase ``name``, or ``None`` if it was not recorded."""
        found = [p.duration for p in self.phases if p.name == name and p.rank is None]
        return sum(found) if found else None

    def finish(self, error: BaseException | None = None) -> None:
        """Close the span and hand it to the observers (backends do not call this)."""
        self.end = time.time()
        if error is not None:
            self.error = f"{type(error).__qualname__}: {error}".splitlines()[0]
        _notify(self)


class _NullPhase:
    """A ``with`` block that records nothing (cheaper than a generator context manager)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_PHASE = _NullPhase()


class _NullSpan(CallSpan):
    """The span of a call made while nothing observes spans: it records nothing, so that
    an unobserved call pays for no clock reads or locks."""

    @property
    def recording(self) -> bool:
        return False

    def phase(  # type: ignore[override]  # a plain context manager, not a generator one
        self, name: str, rank: int | None = None
    ) -> contextlib.AbstractContextManager[None]:
        return _NULL_PHASE

    def add_phase(self, name: str, start: float, end: float, rank: int | None = None) -> None:
        return None

    def add_bytes(self, put: int = 0, fetched: int = 0) -> None:
        return None

    def finish(self, error: BaseException | None = None) -> None:
        return None


#: Shared by every call made while no observer is registered.
NULL_SPAN: CallSpan = _NullSpan(group="", method="", blocking=True, ranks=(), call_id=0)


def new_span(group: str, method: str, blocking: bool, ranks: tuple[int, ...]) -> CallSpan:
    """A recording span when an observer is registered, else :data:`NULL_SPAN`."""
    if not _observers:
        return NULL_SPAN
    return CallSpan(group=group, method=method, blocking=blocking, ranks=ranks)


@contextlib.contextmanager
def driver_span(group: str, name: str) -> Iterator[CallSpan]:
    """Record the ``with`` block as one span of ``group`` named ``name`` (phase ``run``),
    finished, and marked with the error if one escapes, when the block ends. Yields the span
    (:data:`NULL_SPAN` while nothing observes spans), to which the block may add bytes."""
    if not isinstance(group, str) or not isinstance(name, str) or not group or not name:
        raise InvalidConfigError(
            f"driver_span: group and name must be non-empty strings, got {group!r}, {name!r}"
        )
    span = new_span(group, name, True, ())
    if not span.recording:
        yield span
        return
    start = time.time()
    error: BaseException | None = None
    try:
        yield span
    except BaseException as exc:
        error = exc
        raise
    finally:
        span.add_phase(RUN_PHASE, start, time.time())
        span.finish(error)


SpanObserver = Callable[[CallSpan], None]

_observers_lock = threading.Lock()
_observers: tuple[SpanObserver, ...] = ()


def add_span_observer(observer: SpanObserver) -> Callable[[], None]:
    """Call ``observer(span)`` after every call; returns a function that removes it.

    Observers run on the thread that finished the call and must be quick; an exception in
    one is logged and otherwise ignored.
    """
    global _observers
    if not callable(observer):
        raise InvalidConfigError(
            f"add_span_observer: observer must be callable, got {type(observer).__qualname__}"
        )
    with _observers_lock:
        _observers = (*_observers, observer)
    return lambda: remove_span_observer(observer)


def remove_span_observer(observer: SpanObserver) -> None:
    """Stop calling ``observer`` (no error if it was not added)."""
    global _observers
    with _observers_lock:
        _observers = tuple(o for o in _observers if o is not observer)


def _notify(span: CallSpan) -> None:
    for observer in _observers:
        try:
            observer(span)
        except Exception:
            logger.exception("span observer %r failed on %s.%s", observer, span.group, span.method)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending, non-empty sequence."""
    index = max(0, math.ceil(q / 100 * len(sorted_values)) - 1)
    return sorted_values[index]


@dataclass(frozen=True)
class PhaseStats:
    """Durations (seconds) of one phase over the recorded calls of one method."""

    count: int
    total: float
    p50: float
    p95: float
    max: float


class SpanRecorder:
    """Keeps the spans of finished calls; exports a trace and a per-method summary.

    Use as a context manager (observes while inside), or call :meth:`start`/:meth:`stop`.
    ``max_spans`` bounds memory: the oldest spans are dropped first. Setting the
    environment variable ``SC_CORE_TRACE_FILE`` makes sc-core start one recorder at import and
    write the trace there at interpreter exit.
    """

    def __init__(self, max_spans: int | None = None) -> None:
        if max_spans is not None and (
            isinstance(max_spans, bool) or not isinstance(max_spans, int) or max_spans < 1
        ):
            raise InvalidConfigError(
                f"SpanRecorder: max_spans must be a positive int or None, got {max_spans!r}"
            )
        self.max_spans = max_spans
        self._spans: list[CallSpan] = []
        self._lock = threading.Lock()
        self._remove: Callable[[], None] | None = None

    def __call__(self, span: CallSpan) -> None:
        with self._lock:
            self._spans.append(span)
            if self.max_spans is not None and len(self._spans) > self.max_spans:
                del self._spans[: len(self._spans) - self.max_spans]

    def start(self) -> SpanRecorder:
        """Begin observing calls (idempotent); returns ``self``."""
        if self._remove is None:
            self._remove = add_span_observer(self)
        return self

    def stop(self) -> None:
        """Stop observing calls; the recorded spans stay."""
        if self._remove is not None:
            self._remove()
            self._remove = None

    def __enter__(self) -> SpanRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def spans(self) -> list[CallSpan]:
        """The recorded spans, oldest first (a copy)."""
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def trace_events(self) -> list[dict[str, Any]]:
        """Chrome trace events: one complete (``"X"``) event per recorded phase.

        Each worker group is a process row (``pid``); the driver's phases are on thread
        ``driver``, a rank's on thread ``rank N``. Times are microseconds.
        """
        events: list[dict[str, Any]] = []
        pid = os.getpid()
        for span in self.spans:
            for ph in span.phases:
                events.append(
                    {
                        "name": f"{span.method}:{ph.name}",
                        "cat": ph.name,
                        "ph": "X",
                        "ts": ph.start * 1e6,
                        "dur": max(ph.duration, 0.0) * 1e6,
                        "pid": f"{span.group} ({pid})",
                        "tid": "driver" if ph.rank is None else f"rank {ph.rank}",
                        "args": {
                            "call_id": span.call_id,
                            "method": span.method,
                            "phase": ph.name,
                            "rank": ph.rank,
                            "blocking": span.blocking,
                            "bytes_put": span.bytes_put,
                            "bytes_fetched": span.bytes_fetched,
                            "error": span.error,
                        },
                    }
                )
        return events

    def chrome_trace(self) -> dict[str, Any]:
        """The trace as a JSON-ready object (Chrome ``about:tracing`` and Perfetto read it)."""
        return {"traceEvents": self.trace_events(), "displayTimeUnit": "ms"}

    def write_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`chrome_trace` as JSON to ``path`` and return the path."""
        out = Path(path)
        out.write_text(json.dumps(self.chrome_trace()), encoding="utf-8")
        return out

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per method (``group.method``; for a :func:`driver_span`, its name): ``calls``,
        ``errors``, ``bytes_put``, ``bytes_fetched`` and, per phase (``run`` for a driver
        span), a :class:`PhaseStats` of the driver-side durations; ``worker`` holds the
        slowest rank's ``execute`` time per call, where backends reported it."""
        grouped: dict[str, list[CallSpan]] = {}
        for span in self.spans:
            grouped.setdefault(f"{span.group}.{span.method}", []).append(span)
        result: dict[str, dict[str, Any]] = {}
        for key, spans in grouped.items():
            phases: dict[str, list[float]] = {}
            for span in spans:
                for name in (*PHASES, RUN_PHASE):
                    d = span.duration(name)
                    if d is not None:
                        phases.setdefault(name, []).append(d)
                per_rank = [p.duration for p in span.phases if p.rank is not None]
                if per_rank:
                    phases.setdefault("worker", []).append(max(per_rank))
            stats = {}
            for name, values in phases.items():
                values.sort()
                stats[name] = PhaseStats(
                    count=len(values),
                    total=sum(values),
                    p50=_percentile(values, 50),
                    p95=_percentile(values, 95),
                    max=values[-1],
                )
            result[key] = {
                "calls": len(spans),
                "errors": sum(1 for s in spans if s.error is not None),
                "bytes_put": sum(s.bytes_put for s in spans),
                "bytes_fetched": sum(s.bytes_fetched for s in spans),
                "phases": stats,
            }
        return result

    def format_summary(self) -> str:
        """:meth:`summary` as a text table (milliseconds)."""
        lines = [
            f"{'method':40} {'phase':9} {'calls':>6} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9}"
        ]
        for key, entry in sorted(self.summary().items()):
            for name, st in entry["phases"].items():
                lines.append(
                    f"{key:40} {name:9} {st.count:6d} {st.p50 * 1e3:9.3f} "
                    f"{st.p95 * 1e3:9.3f} {st.max * 1e3:9.3f}"
                )
        return "\n".join(lines)
