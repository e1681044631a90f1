"""sc-core: workers, worker groups and an in-process backend for single-controller programs.

A :class:`Worker` subclass declares methods with :func:`sc_dispatch.register`; a worker
group (:class:`LocalWorkerGroup` here, ``sc_ray.RayWorkerGroup`` on Ray) builds one
instance per rank and binds each registered method as a distributed call:
``wg.compute(batch)`` splits ``batch``, runs ``compute`` on every worker and joins the
results. :class:`WorkerGroup` is the base class of every backend; its module docstring is
the backend contract. :class:`ResourcePoolManager` keeps named pools for a trainer's roles.
Depends on sc-dispatch only.
"""

from __future__ import annotations

import atexit
import logging

from ._backend import Backend, CallHandle, RankArgs, ReplacedWorkers, ReplacingBackend
from ._busy import AbandonedCall
from ._call import Call, CallOptions
from ._call_path import CallStream
from ._colocate import create_colocated_worker_cls, register_class_unwrapper
from ._context import (
    InProcessRendezvous,
    Rendezvous,
    WorkerContext,
    current_worker_context,
    rendezvous_from_env,
    worker_context,
    worker_environ,
)
from ._errors import (
    BackendNotImplementedError,
    CallTimeoutError,
    ColocationError,
    ConfigTypeError,
    InjectedFaultError,
    InvalidCallOptionsError,
    InvalidConfigError,
    MeshRegistrationError,
    MethodCollisionError,
    MissingEnvironmentError,
    RendezvousError,
    RendezvousTimeoutError,
    ResourcePoolError,
    ScCoreError,
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
from ._faults import FAULT_ACTIONS, ArmedFault, FaultAction, take_fault
from ._fused import create_colocated_worker_cls_fused, create_colocated_worker_raw_cls
from ._future import LazyFuture
from ._local import LocalBackend, LocalHandle, LocalWorkerGroup
from ._pool_manager import ResourcePoolManager
from ._resource import ClassWithInitArgs, ResourcePool
from ._settings import SETTINGS, TRACE_FILE
from ._spans import (
    CallSpan,
    PhaseRecord,
    PhaseStats,
    SpanObserver,
    SpanRecorder,
    add_span_observer,
    driver_span,
    remove_span_observer,
)
from ._units import StreamingBackend
from ._worker import (
    RESERVED_WORKER_ATTRS,
    DistGlobalInfo,
    DistRankInfo,
    Worker,
    WorkerHelper,
    normalize_visible_devices,
)
from ._worker_group import MethodProxy, WorkerGroup

__version__ = "0.1.0"

__all__ = [
    "SETTINGS",
    "RESERVED_WORKER_ATTRS",
    "FAULT_ACTIONS",
    "AbandonedCall",
    "ArmedFault",
    "Backend",
    "BackendNotImplementedError",
    "Call",
    "CallOptions",
    "CallStream",
    "CallSpan",
    "CallHandle",
    "CallTimeoutError",
    "ClassWithInitArgs",
    "ColocationError",
    "ConfigTypeError",
    "DistGlobalInfo",
    "DistRankInfo",
    "FaultAction",
    "InProcessRendezvous",
    "InjectedFaultError",
    "InvalidCallOptionsError",
    "InvalidConfigError",
    "LazyFuture",
    "LocalBackend",
    "LocalHandle",
    "LocalWorkerGroup",
    "MeshRegistrationError",
    "MethodCollisionError",
    "MethodProxy",
    "StreamingBackend",
    "MissingEnvironmentError",
    "PhaseRecord",
    "PhaseStats",
    "RankArgs",
    "ReplacedWorkers",
    "ReplacingBackend",
    "Rendezvous",
    "RendezvousError",
    "RendezvousTimeoutError",
    "ResourcePool",
    "ResourcePoolError",
    "ResourcePoolManager",
    "ScCoreError",
    "SpanObserver",
    "SpanRecorder",
    "UnknownMeshError",
    "UnknownMethodError",
    "UnsupportedCallError",
    "UnknownRoleError",
    "VisibleDevicesError",
    "Worker",
    "WorkerContext",
    "WorkerDiedError",
    "WorkerEnvironmentError",
    "WorkerError",
    "WorkerGroup",
    "WorkerGroupClosedError",
    "WorkerGroupError",
    "WorkerHelper",
    "__version__",
    "add_span_observer",
    "driver_span",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "current_worker_context",
    "normalize_visible_devices",
    "register_class_unwrapper",
    "remove_span_observer",
    "rendezvous_from_env",
    "take_fault",
    "worker_context",
    "worker_environ",
]


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
