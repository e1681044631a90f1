"""The exceptions sc-ray raises of its own.

Failures of a worker during a call are sc-core's (``WorkerError``, ``WorkerDiedError``,
``CallTimeoutError``); sc-ray adds only what is about Ray resources and actor set-up. Each
class subclasses :class:`ScRayError` and exactly one builtin exception, the one it means::

    ScRayError (Exception)                         base class of everything below
    ├── RayResourcePoolError (ValueError)          a pool spec that cannot work: bad
    │   │                                          process_on_nodes, split sizes that do not
    │   │                                          add up, pools that cannot be merged, a
    │   │                                          placement-group name already taken, an
    │   │                                          actor asking more than its bundle holds
    │   └── InsufficientResourcesError             a pool asking more CPUs or accelerators than
    │                                              the whole cluster (or any one node, for a
    │                                              node's placement group) has: it could never
    │                                              be placed, so it fails at once
    ├── PlacementTimeoutError (TimeoutError)       the cluster did not reserve the pool's
    │                                              bundles within the placement deadline;
    │                                              names what was asked and what the cluster has
    ├── WorkerEnvError (ValueError)                a user ``worker_env`` / ``runtime_env`` that
    │                                              sets a variable the worker group owns
    │                                              (WORLD_SIZE, RANK, MASTER_ADDR, ...)
    └── DetachedWorkerError (LookupError)          ``from_detached`` names an actor that does
                                                   not exist

``RayResourcePoolError`` also subclasses sc-core's ``ResourcePoolError`` (a ``ValueError`` as
well), so ``except sc_core.ResourcePoolError`` catches bad pools of either package. An
unknown role in :meth:`ResourcePoolManager.get_resource_pool` is sc-core's
``UnknownRoleError`` (a ``KeyError``). Messages name what was asked and what the cluster has.
"""

from __future__ import annotations

from sc_core import ResourcePoolError as _CoreResourcePoolError

__all__ = [
    "DetachedWorkerError",
    "InsufficientResourcesError",
    "PlacementTimeoutError",
    "RayResourcePoolError",
    "ScRayError",
    "WorkerEnvError",
]


class ScRayError(Exception):
    """Base class of every error sc-ray raises of its own."""


class RayResourcePoolError(ScRayError, _CoreResourcePoolError):
    """A resource pool that cannot be built, placed, split or merged as asked."""


class InsufficientResourcesError(RayResourcePoolError):
    """A pool that asks more than the whole cluster (or one node) has: it can never be placed."""


class PlacementTimeoutError(ScRayError, TimeoutError):
    """The cluster did not reserve a pool's bundles within the placement deadline."""


class WorkerEnvError(ScRayError, ValueError):
    """A user environment that would override a variable the worker group sets."""


class DetachedWorkerError(ScRayError, LookupError):
    """A detached worker that ``from_detached`` cannot find."""
