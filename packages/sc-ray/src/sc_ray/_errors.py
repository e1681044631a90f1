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
    │   │                                          bundles within the placement deadline;
    │   │                                          names what was asked and what the cluster has
    │   └── RankPlacementTimeoutError              ``replace_ranks``: the bundles of the ranks
    │                                              to replace, whose node was lost, were not
    │                                              placed again on a live node in time; names
    │                                              the group, the ranks and what is missing
    ├── WorkerEnvError (ValueError)                a user ``worker_env`` / ``runtime_env`` that
    │                                              sets a variable the worker group owns
    │                                              (WORLD_SIZE, RANK, MASTER_ADDR, ...)
    ├── DetachedWorkerError (LookupError)          ``from_detached`` names an actor that does
    │                                              not exist
    ├── UnknownRunError (KeyError)                 ``RayRun.attach`` / ``teardown_run`` name a
    │                                              run the cluster does not hold
    ├── RunInUseError (RuntimeError)               another driver holds the run's lease (its
    │                                              heartbeat is fresh and its job alive), or
    │                                              this driver lost the lease (fenced by epoch)
    ├── RunMismatchError (ValueError)              a re-attaching driver asks for a pool or
    │                                              group that differs from the run's: its spec,
    │                                              its workers' code or configuration
    ├── RunIdError (ValueError)                    a run id that is not
    │                                              ``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``, or a
    │                                              driver not connected in the run's namespace
    ├── RunExistsError (ValueError)                ``RayRun.create`` for a run id the cluster
    │                                              already holds
    └── NodeLossError (RuntimeError)               ``NodeLoss`` (fault injection): the node to
                                                   lose is the driver's own or not alive, or
                                                   the process that loses it did not start
                                                   there, or the node was not gone in time

``RayResourcePoolError`` also subclasses sc-core's ``ResourcePoolError`` (a ``ValueError`` as
well), so ``except sc_core.ResourcePoolError`` catches bad pools of either package. An
unknown role in :meth:`ResourcePoolManager.get_resource_pool` is sc-core's
``UnknownRoleError`` (a ``KeyError``). Messages name what was asked and what the cluster has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sc_core import ResourcePoolError as _CoreResourcePoolError

__all__ = [
    "DetachedWorkerError",
    "InsufficientResourcesError",
    "NodeLossError",
    "PlacementTimeoutError",
    "RankPlacementTimeoutError",
    "RayResourcePoolError",
    "RunExistsError",
    "RunIdError",
    "RunInUseError",
    "RunMismatchError",
    "ScRayError",
    "UnknownRunError",
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


class RankPlacementTimeoutError(PlacementTimeoutError):
    """``replace_ranks`` could not start new workers for ``ranks`` of group ``group``: their
    placement-group bundles, lost with their node, were not placed again on a live node
    within ``timeout_s`` (the pool's placement deadline). ``asked`` is what one bundle
    reserves, ``missing`` how much of it no live node has free (empty when the cluster has
    it in all but Ray did not place the bundle in time)."""

    def __init__(
        self,
        message: str,
        *,
        group: str,
        ranks: Sequence[int],
        asked: Mapping[str, float],
        missing: Mapping[str, float],
        timeout_s: float,
    ) -> None:
        super().__init__(message)
        self.group = group
        self.ranks = tuple(ranks)
        self.asked = dict(asked)
        self.missing = dict(missing)
        self.timeout_s = timeout_s


class WorkerEnvError(ScRayError, ValueError):
    """A user environment that would override a variable the worker group sets."""


class DetachedWorkerError(ScRayError, LookupError):
    """A detached worker that ``from_detached`` cannot find."""


class UnknownRunError(ScRayError, KeyError):
    """A run id the cluster holds nothing of."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class RunInUseError(ScRayError, RuntimeError):
    """A run whose lease another (live) driver holds, or a driver fenced out of its run."""


class RunMismatchError(ScRayError, ValueError):
    """A re-attaching driver's pool, group, code or configuration differs from the run's."""


class RunIdError(ScRayError, ValueError):
    """A malformed run id, or a driver not connected to Ray in the run's namespace."""


class RunExistsError(ScRayError, ValueError):
    """``RayRun.create`` for a run that already exists."""


class NodeLossError(ScRayError, RuntimeError):
    """:class:`~sc_ray.NodeLoss` could not lose the node it was asked to: the driver's own,
    one not alive, or one where its killer did not start or finish in time."""
