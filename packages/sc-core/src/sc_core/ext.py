"""sc-core's extender tier, besides the backend contract (:mod:`sc_core.backend`).

* Observing calls: :func:`add_span_observer` / :func:`remove_span_observer` register a
  :data:`SpanObserver`, called with each finished :class:`~sc_core.CallSpan`; a span's
  phases are :class:`PhaseRecord` s, and ``SpanRecorder.summary()`` answers
  :class:`PhaseStats` per method and phase. (A user who only wants a trace writes
  :class:`~sc_core.SpanRecorder`.)
* Fault injection: the actions ``WorkerGroup.inject_fault`` takes (:data:`FaultAction`,
  :data:`FAULT_ACTIONS`); :func:`arm_torn_dispatch` / :func:`disarm_torn_dispatch`, a
  driver that stops while it hands a call out (the call reaches its first ranks only),
  for testing a re-attach that completes the torn call.
* The rules a worker class follows: the attribute names a worker subclass must not define
  (:data:`RESERVED_WORKER_ATTRS`), and :func:`normalize_visible_devices`, which folds
  HIP/ROCR device variables into ``CUDA_VISIBLE_DEVICES`` as a worker does at start.
"""

from sc_dispatch import _public

from ._faults import FAULT_ACTIONS, FaultAction
from ._replay import arm_torn_dispatch, disarm_torn_dispatch
from ._spans import (
    PhaseRecord,
    PhaseStats,
    SpanObserver,
    add_span_observer,
    remove_span_observer,
)
from ._worker import RESERVED_WORKER_ATTRS, normalize_visible_devices

__all__ = [
    "FAULT_ACTIONS",
    "FaultAction",
    "PhaseRecord",
    "PhaseStats",
    "RESERVED_WORKER_ATTRS",
    "SpanObserver",
    "add_span_observer",
    "arm_torn_dispatch",
    "disarm_torn_dispatch",
    "normalize_visible_devices",
    "remove_span_observer",
]

_public.publish(globals())
