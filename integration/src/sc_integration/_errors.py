"""The exceptions sc-integration raises.

Every error is raised explicitly (never through ``assert``). Each class subclasses the
package's base :class:`ScIntegrationError` and exactly one builtin exception, the one it
means, so callers may catch either::

    ScIntegrationError (Exception)                  base class of everything below
    ├── TrainerConfigError (ValueError)             a configuration value out of range, or
    │                                               two values that do not fit together
    ├── TaskError (ValueError)                      a prompt, response or reward batch the toy
    │                                               task cannot score: wrong shape, unknown
    │                                               token, ...
    ├── CheckpointNotFoundError (FileNotFoundError) a checkpoint to resume from that is
    │                                               missing, incomplete or unreadable
    ├── RunStateNotFoundError (FileNotFoundError)   a re-attach whose output folder holds no
    │                                               run state (run_state.json) of that run
    ├── CheckpointMismatchError (ValueError)        a checkpoint that does not fit this run:
    │                                               another shape (workers per role, model
    │                                               size, ...) or already at the last step
    ├── TrainingDivergedError (RuntimeError)        a loss or reward that is not finite
    ├── WorkerOutputError (RuntimeError)            a worker group returned a batch without
    │                                               the columns the next stage reads (or a
    │                                               rollout server more tokens than asked)
    ├── TrainerRecoveryError (RuntimeError)         a worker died and the run may not recover
    │                                               (``max_recoveries`` reached)
    ├── StalenessBoundError (RuntimeError)          an async run about to update with a batch
    │                                               sampled more than ``async_staleness``
    │                                               versions before the actor's weights
    ├── TrainerStateError (RuntimeError)            the trainer used before ``init_workers``
    │                                               (or after ``close``), or a spawned role
    │                                               group that does not bind its role's methods
    ├── RolloutFleetError (RuntimeError)            a rollout server of a fleet that fails to
    │                                               start, restart or stop in its Ray actor,
    │                                               or a fleet used after ``close``
    ├── RolloutInputError (ValueError)              what the router rollout or the weight
    │                                               publisher cannot take: a prompt row
    │                                               without tokens, top-k sampling, a weight
    │                                               version not above the last one, ...
    ├── AgentRolloutError (RuntimeError)            a step whose agent sessions were all
    │                                               dropped (each one's reason in the message)
    ├── WeightPublishError (OSError)                weights that cannot be written to (or
    │                                               copied into) the run's weight directory
    └── BackendMismatchError (TypeError)            a pool, class or group of one backend
                                                    given to another

"""

from __future__ import annotations

__all__ = [
    "AgentRolloutError",
    "BackendMismatchError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "ScIntegrationError",
    "StalenessBoundError",
    "TaskError",
    "TrainerConfigError",
    "TrainerRecoveryError",
    "TrainerStateError",
    "RolloutFleetError",
    "RolloutInputError",
    "RunStateNotFoundError",
    "TrainingDivergedError",
    "WeightPublishError",
    "WorkerOutputError",
]


class ScIntegrationError(Exception):
    """Base class of every error raised by sc-integration."""


class TrainerConfigError(ScIntegrationError, ValueError):
    """A configuration value out of range, or two values that do not fit together."""


class TaskError(ScIntegrationError, ValueError):
    """A batch the toy task cannot build or score."""


class CheckpointNotFoundError(ScIntegrationError, FileNotFoundError):
    """A checkpoint to resume from that is missing, incomplete or unreadable."""


class CheckpointMismatchError(ScIntegrationError, ValueError):
    """A checkpoint to resume from that does not fit this run's configuration."""


class TrainingDivergedError(ScIntegrationError, RuntimeError):
    """A loss or reward that is not finite."""


class WorkerOutputError(ScIntegrationError, RuntimeError):
    """A worker group returned a batch without the columns the next stage reads, or a
    rollout server more tokens than it was asked for."""


class TrainerRecoveryError(ScIntegrationError, RuntimeError):
    """A worker died and the run may not recover (``max_recoveries`` reached); the death is
    its ``__cause__``."""


class StalenessBoundError(ScIntegrationError, RuntimeError):
    """An asynchronous run (``async_staleness`` k > 0) about to start a generation, or to
    update with a batch, whose weights are more than k versions behind the actor's."""


class TrainerStateError(ScIntegrationError, RuntimeError):
    """The trainer used in a state that cannot serve the request: its worker groups asked
    for before ``init_workers`` or after ``close``, or a spawned role group that does not
    bind the methods of its role's class."""


class RolloutFleetError(ScIntegrationError, RuntimeError):
    """A rollout server of a :class:`~sc_integration.RolloutServerFleet` that fails to
    start, restart or stop in its Ray actor (the message names the server's index and its
    command line), or a fleet used after ``close``."""


class RolloutInputError(ScIntegrationError, ValueError):
    """What the router rollout or the weight publisher cannot take: a prompt row without
    tokens, a sampling setting the servers do not have (top-k) or out of range, a weight
    version not above the last one published, weights that are not tensors, ..."""


class WeightPublishError(ScIntegrationError, OSError):
    """Weights that cannot be written to, or copied into, the run's weight directory."""


class BackendMismatchError(ScIntegrationError, TypeError):
    """A resource pool, worker class or worker group of one backend given to another."""


class AgentRolloutError(ScIntegrationError, RuntimeError):
    """A step's agent sessions were all dropped (deadline, error, cancelled); the message
    counts the reasons and quotes the first error."""


class RunStateNotFoundError(ScIntegrationError, FileNotFoundError):
    """A driver re-attaching to a detached run whose output folder holds no run state
    (``run_state.json``) of that run: another folder, or another run's."""
