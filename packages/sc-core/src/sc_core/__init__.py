"""sc-core: workers, worker groups and an in-process backend for single-controller programs.

A :class:`Worker` subclass declares methods with :func:`sc_dispatch.register`; a worker
group (:class:`LocalWorkerGroup` here, ``sc_ray.RayWorkerGroup`` on Ray) builds one
instance per rank and binds each registered method as a distributed call:
``wg.compute(batch)`` splits ``batch``, runs ``compute`` on every worker and joins the
results. :class:`ResourcePoolManager` keeps named pools for a trainer's roles;
:class:`SpanRecorder` records every call for a trace. Depends on sc-dispatch only.

This module holds what a user of worker groups writes. The other public modules:

* :mod:`sc_core.backend`, the backend contract: what a worker group's backend implements
  (:class:`~sc_core.backend.Backend`, the :class:`~sc_core.backend.Call` it is handed) and
  the worker-side context and rendezvous it sets up; :class:`WorkerGroup` is the base class
  of every backend's group;
* :mod:`sc_core.ext`, the rest of the extender tier: span observers and the records they
  read, the fault-injection actions, the rules a worker class follows;
* :mod:`sc_core.verl`, verl's worker helpers (``DistRankInfo``, ``DistGlobalInfo``,
  ``WorkerHelper``).
"""

from __future__ import annotations

import atexit
import logging

from sc_dispatch import _public

from ._call_ids import CallId, CallIds, CallRecord, JournaledCall
from ._call_path import CallStream
from ._colocate import create_colocated_worker_cls
from ._context import worker_environ
from ._errors import (
    CallTimeoutError,
    ColocationError,
    ConfigTypeError,
    InjectedFaultError,
    InvalidCallOptionsError,
    InvalidConfigError,
    MeshRegistrationError,
    MethodCollisionError,
    MissingEnvironmentError,
    ResourcePoolError,
    ScCoreError,
    StaleDriverError,
    UnknownMeshError,
    UnknownMethodError,
    UnknownRoleError,
    UnsupportedCallError,
    VisibleDevicesError,
    WorkerDiedError,
    WorkerEnvironmentError,
    WorkerError,
    WorkerGroupClosedError,
    WorkerGroupError,
)
from ._fused import create_colocated_worker_cls_fused, create_colocated_worker_raw_cls
from ._future import LazyFuture
from ._local import LocalWorkerGroup
from ._pool_manager import ResourcePoolManager
from ._replay import TornCall
from ._resource import ClassWithInitArgs, ResourcePool
from ._settings import SETTINGS, TRACE_FILE
from ._spans import CallSpan, SpanRecorder, driver_span
from ._worker import Worker
from ._worker_group import MethodProxy, WorkerGroup

__version__ = "0.2.0"

__all__ = [
    "CallId",
    "CallIds",
    "CallRecord",
    "CallSpan",
    "CallStream",
    "CallTimeoutError",
    "ClassWithInitArgs",
    "ColocationError",
    "ConfigTypeError",
    "InjectedFaultError",
    "InvalidCallOptionsError",
    "InvalidConfigError",
    "JournaledCall",
    "LazyFuture",
    "LocalWorkerGroup",
    "MeshRegistrationError",
    "MethodCollisionError",
    "MethodProxy",
    "MissingEnvironmentError",
    "ResourcePool",
    "ResourcePoolError",
    "ResourcePoolManager",
    "SETTINGS",
    "ScCoreError",
    "SpanRecorder",
    "StaleDriverError",
    "TornCall",
    "UnknownMeshError",
    "UnknownMethodError",
    "UnknownRoleError",
    "UnsupportedCallError",
    "VisibleDevicesError",
    "Worker",
    "WorkerDiedError",
    "WorkerEnvironmentError",
    "WorkerError",
    "WorkerGroup",
    "WorkerGroupClosedError",
    "WorkerGroupError",
    "__version__",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "driver_span",
    "worker_environ",
]

_public.publish(globals())

# The second tier, imported here so that its names report their public module from the start.
from . import backend, ext, verl  # noqa: E402, F401


def _install_trace_file_recorder() -> None:
    """``SC_CORE_TRACE_FILE=path``: record every call and write the trace there at exit."""
    path = TRACE_FILE.get()
    if path is None:
        return
    recorder = SpanRecorder().start()

    def write() -> None:
        try:
            recorder.write_chrome_trace(path)
        except OSError:
            logging.getLogger("sc_core.spans").exception(
                "cannot write %s=%s", TRACE_FILE.name, path
            )

    atexit.register(write)


_install_trace_file_recorder()
