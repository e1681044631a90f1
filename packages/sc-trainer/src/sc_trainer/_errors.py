"""The exceptions sc-trainer raises.

Every error is raised explicitly (never through ``assert``). Each class subclasses the
package's base :class:`ScTrainerError` and exactly one builtin exception, the one it
means, so callers may catch either::

    ScTrainerError (Exception)                  base class of everything below
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
    ├── ExactModeMismatchError (RuntimeError)       with exact_check, a response token whose
    │                                               sampled log-prob differs from the actor's
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
    ├── BackendMismatchError (TypeError)            a pool, class or group of one backend
    │                                               given to another
    ├── MissingExtraError (ImportError)             an optional integration used without its
    │                                               extra installed (the message names it)
    ├── ClusterConnectError (ConnectionError)       a standing Ray cluster a detached run
    │                                               cannot connect to (what to set is named)
    ├── DatasetNotFoundError (FileNotFoundError)    a data file (data.train_files, val_files)
    │                                               that does not exist
    ├── DatasetError (ValueError)                   a data file or row the trainer cannot use:
    │                                               no prompt column, a row without ground
    │                                               truth, a prompt too long to keep, ...
    ├── RewardNotFoundError (LookupError)           a reward function path or name that does
    │                                               not exist, or is not callable
    └── RewardFunctionError (RuntimeError)          a reward function that raised, timed out
                                                    or returned no number, for a row (its
                                                    index and data_source in the message)

"""

from __future__ import annotations

__all__ = [
    "AgentRolloutError",
    "BackendMismatchError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "ClusterConnectError",
    "DatasetError",
    "DatasetNotFoundError",
    "ExactModeMismatchError",
    "MissingExtraError",
    "RewardFunctionError",
    "RewardNotFoundError",
    "ScTrainerError",
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


class ScTrainerError(Exception):
    """Base class of every error raised by sc-trainer."""


class TrainerConfigError(ScTrainerError, ValueError):
    """A configuration value out of range, or two values that do not fit together."""


class TaskError(ScTrainerError, ValueError):
    """A batch the toy task cannot build or score."""


class CheckpointNotFoundError(ScTrainerError, FileNotFoundError):
    """A checkpoint to resume from that is missing, incomplete or unreadable."""


class CheckpointMismatchError(ScTrainerError, ValueError):
    """A checkpoint to resume from that does not fit this run's configuration."""


class TrainingDivergedError(ScTrainerError, RuntimeError):
    """A loss or reward that is not finite."""


class ExactModeMismatchError(ScTrainerError, RuntimeError):
    """The exact mode's check (``exact_check``) found a response token whose log-prob, as the
    sampler reported it, differs from the actor's recomputation: the message names the step,
    the row, the position, the token and both values."""


class WorkerOutputError(ScTrainerError, RuntimeError):
    """A worker group returned a batch without the columns the next stage reads, or a
    rollout server more tokens than it was asked for."""


class TrainerRecoveryError(ScTrainerError, RuntimeError):
    """A worker died and the run may not recover (``max_recoveries`` reached); the death is
    its ``__cause__``."""


class StalenessBoundError(ScTrainerError, RuntimeError):
    """An asynchronous run (``async_staleness`` k > 0) about to start a generation, or to
    update with a batch, whose weights are more than k versions behind the actor's."""


class TrainerStateError(ScTrainerError, RuntimeError):
    """The trainer used in a state that cannot serve the request: its worker groups asked
    for before ``init_workers`` or after ``close``, or a spawned role group that does not
    bind the methods of its role's class."""


class RolloutFleetError(ScTrainerError, RuntimeError):
    """A rollout server of a :class:`~sc_trainer.rollout.RolloutServerFleet` that fails to
    start, restart or stop in its Ray actor (the message names the server's index and its
    command line), or a fleet used after ``close``."""


class RolloutInputError(ScTrainerError, ValueError):
    """What the router rollout or the weight publisher cannot take: a prompt row without
    tokens, a sampling setting the servers do not have (top-k) or out of range, a weight
    version not above the last one published, weights that are not tensors, ..."""


class WeightPublishError(ScTrainerError, OSError):
    """Weights that cannot be written to, or copied into, the run's weight directory."""


class BackendMismatchError(ScTrainerError, TypeError):
    """A resource pool, worker class or worker group of one backend given to another."""


class AgentRolloutError(ScTrainerError, RuntimeError):
    """A step's agent sessions were all dropped (deadline, error, cancelled); the message
    counts the reasons and quotes the first error."""


class RunStateNotFoundError(ScTrainerError, FileNotFoundError):
    """A driver re-attaching to a detached run whose output folder holds no run state
    (``run_state.json``) of that run: another folder, or another run's."""


class MissingExtraError(ScTrainerError, ImportError):
    """An optional integration used without its extra installed; the message names the
    extra to install (``pip install 'sc-trainer[plot]'``)."""


class DatasetNotFoundError(ScTrainerError, FileNotFoundError):
    """A data file named by the configuration (``data.train_files``, ``data.val_files``)
    that does not exist."""


class DatasetError(ScTrainerError, ValueError):
    """A data file or row the trainer cannot use: a file it cannot read, no prompt column, a
    row without ground truth, a prompt longer than ``data.max_prompt_length`` with
    ``truncation="error"``, a prompt that cannot be tokenized. The message names the file and
    the row."""


class RewardNotFoundError(ScTrainerError, LookupError):
    """A reward function that cannot be found: ``custom_reward_function.path`` is not a
    Python file, or the file has no callable ``custom_reward_function.name``."""


class RewardFunctionError(ScTrainerError, RuntimeError):
    """A reward function that raised, ran past its deadline or returned something that is not
    a number (nor a dict with a number under ``"score"``), for one row: the message names the
    row's index and ``data_source`` and carries the traceback. Never recorded as a zero
    unless the run opted into counting failures."""


class ClusterConnectError(ScTrainerError, ConnectionError):
    """A detached run's driver that cannot connect to its standing Ray cluster: nothing
    listens at the address, or the cluster refuses the driver (token authentication); the
    message names the address and what to set."""


def int_at_least(
    value: object, minimum: int, what: str, error: type[Exception] = TrainerConfigError
) -> int:
    """``value`` if it is an int (not a bool) of at least ``minimum``; else ``error`` saying
    that ``what`` (``"Owner: name"``) must be one."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise error(f"{what} must be an int >= {minimum}, got {value!r}")
    return value
