"""sc-core's backend contract: what runs the workers of a worker group.

For people who write a backend (sc-ray's is one) or a test double of one; a user of worker
groups needs none of it. A :class:`~sc_core.WorkerGroup` binds methods, dispatches and
collects; it holds a :class:`Backend` that runs the workers and hands it each call as a
:class:`Call`::

    handle = backend.start(call, method_name, rank_args)   # a CallHandle, at once
    values = backend.wait(handle)                          # blocking calls
    futures = backend.pending(handle)                      # non-blocking calls

* The contract: :class:`Backend`, :class:`CallHandle`, :data:`RankArgs`, :class:`Call` and
  its :class:`CallOptions`; the optional :class:`StreamingBackend` (wait for the first of
  several calls) and :class:`ReplacingBackend` (start a worker in place of a dead one,
  answering :class:`ReplacedWorkers`); :class:`AbandonedCall`, a call a rank still runs
  after the group gave up on it; :class:`BackendNotImplementedError`, raised when a group
  lacks what a call needs; :func:`reported_rank`, which of several ranks' errors a failed
  call reports (the lowest rank whose error is not the consequence of another's: an error
  marked with :data:`CAUSED_BY_PEER_ATTR`, see :func:`caused_by_peer`).
* The in-process backend, :class:`LocalBackend` with its :class:`LocalHandle`.
* A worker's side: the :class:`WorkerContext` a backend gives each worker
  (:func:`worker_context`, :func:`current_worker_context`), the :class:`Rendezvous` through
  which rank 0 publishes its address (:class:`InProcessRendezvous`,
  :func:`rendezvous_from_env`; failures are :class:`RendezvousError` and
  :class:`RendezvousTimeoutError`), the fault a rank is armed with
  (:func:`take_fault`, :class:`ArmedFault`), and :func:`register_class_unwrapper`, which
  lets colocation see the worker class inside a backend's wrapper class; :func:`free_port`,
  the TCP port a rendezvous (or anything else of sc's) binds.
* Exactly-once calls: a call with an id reaches each rank with it under the keyword
  :data:`CALL_ID_KWARG`; a backend runs every worker method through :func:`run_journaled`
  (:func:`run_journaled_async` in an async actor), which takes the id out and runs the
  method once per id, answering replays from the worker's journal (the outcomes of the
  last :data:`KEEP_SCOPES` steps).
* The control lane: a backend runs a rank's call for which :func:`on_control_lane` is true
  beside the rank's running call when it can (the in-process backend on a second thread
  per rank, sc-ray in a concurrency group of a detached run's actors): the framework's
  queries (:data:`CONTROL_METHODS`) and a call a re-attached driver sends to be answered
  from the journal only (:data:`JOURNAL_LANE_KWARG`), so that a rank busy in a torn call
  answers them at once. A backend without one runs them in order: correct, but slower to
  answer.
"""

from sc_dispatch import _public

from ._backend import Backend, CallHandle, RankArgs, ReplacedWorkers, ReplacingBackend
from ._busy import AbandonedCall
from ._call import Call, CallOptions
from ._colocate import register_class_unwrapper
from ._context import (
    InProcessRendezvous,
    Rendezvous,
    WorkerContext,
    current_worker_context,
    rendezvous_from_env,
    worker_context,
)
from ._errors import (
    CAUSED_BY_PEER_ATTR,
    BackendNotImplementedError,
    RendezvousError,
    RendezvousTimeoutError,
    caused_by_peer,
    reported_rank,
)
from ._faults import ArmedFault, take_fault
from ._journal import (
    CALL_ID_KWARG,
    JOURNAL_LANE_KWARG,
    KEEP_SCOPES,
    run_journaled,
    run_journaled_async,
)
from ._lanes import CONTROL_METHODS, on_control_lane
from ._local import LocalBackend, LocalHandle
from ._ports import free_port
from ._units import StreamingBackend

__all__ = [
    "AbandonedCall",
    "ArmedFault",
    "Backend",
    "BackendNotImplementedError",
    "CALL_ID_KWARG",
    "CAUSED_BY_PEER_ATTR",
    "CONTROL_METHODS",
    "Call",
    "CallHandle",
    "CallOptions",
    "InProcessRendezvous",
    "JOURNAL_LANE_KWARG",
    "KEEP_SCOPES",
    "LocalBackend",
    "LocalHandle",
    "RankArgs",
    "Rendezvous",
    "RendezvousError",
    "RendezvousTimeoutError",
    "ReplacedWorkers",
    "ReplacingBackend",
    "StreamingBackend",
    "WorkerContext",
    "caused_by_peer",
    "current_worker_context",
    "free_port",
    "on_control_lane",
    "register_class_unwrapper",
    "rendezvous_from_env",
    "reported_rank",
    "run_journaled",
    "run_journaled_async",
    "take_fault",
    "worker_context",
]

_public.publish(globals())
