"""Starting a run: the launchers that build its workers on one backend, and the task runner.

:class:`TaskRunner` (verl's name) maps roles to worker classes and resource pools, starts
the backend through a launcher, builds the :class:`~sc_trainer.RayPPOTrainer`, trains, and
writes the plot and the call trace. :func:`make_launcher` picks the launcher a configuration
asks for: :class:`RayLauncher` (a local Ray cluster, or the one running),
:class:`InProcessLauncher` (every worker in this process) or :class:`DetachedRayLauncher` (a
detached run's workers on a standing cluster, re-attached to by a new driver).
"""

from sc_dispatch import _public

from .._errors import BackendMismatchError, ClusterConnectError
from ..trainer import Launcher
from ._launchers import (
    WORKER_ENV,
    DetachedRayLauncher,
    InProcessLauncher,
    RayLauncher,
    make_launcher,
    teardown_detached_run,
)
from ._runner import TaskRunner

__all__ = [
    "BackendMismatchError",
    "ClusterConnectError",
    "DetachedRayLauncher",
    "InProcessLauncher",
    "Launcher",
    "RayLauncher",
    "TaskRunner",
    "WORKER_ENV",
    "make_launcher",
    "teardown_detached_run",
]

_public.publish(globals())
