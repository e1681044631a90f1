"""The exceptions sc-integration raises.

Every error is raised explicitly (never through ``assert``) and subclasses the builtin
exception it means, so callers may catch either::

    IntegrationError (Exception)              base class of everything below
    ├── TrainerConfigError (ValueError)       a configuration value out of range, or two
    │                                         values that do not fit together
    ├── TaskError (ValueError)                a prompt, response or reward batch the toy task
    │                                         cannot score: wrong shape, unknown token, ...
    ├── CheckpointError (FileNotFoundError)   a checkpoint to resume from that is missing or
    │                                         incomplete
    ├── TrainingDivergedError (RuntimeError)  a loss or reward that is not finite
    ├── WorkerOutputError (RuntimeError)      a worker group returned a batch without the
    │                                         columns the next stage reads
    ├── TrainerStateError (RuntimeError)      the trainer used before ``init_workers`` (or
    │                                         after ``close``), or a spawned role group that
    │                                         does not bind its role's methods
    └── BackendMismatchError (TypeError)      a pool, class or group of one backend given to
                                              another (a ``ResourcePool`` to the Ray backend)

Messages name the method or option and the offending value.
"""

from __future__ import annotations

__all__ = [
    "BackendMismatchError",
    "CheckpointError",
    "IntegrationError",
    "TaskError",
    "TrainerConfigError",
    "TrainerStateError",
    "TrainingDivergedError",
    "WorkerOutputError",
]


class IntegrationError(Exception):
    """Base class of every error raised by sc-integration."""


class TrainerConfigError(IntegrationError, ValueError):
    """A configuration value out of range, or two values that do not fit together."""


class TaskError(IntegrationError, ValueError):
    """A batch the toy task cannot build or score."""


class CheckpointError(IntegrationError, FileNotFoundError):
    """A checkpoint to resume from that is missing or incomplete."""


class TrainingDivergedError(IntegrationError, RuntimeError):
    """A loss or reward that is not finite."""


class WorkerOutputError(IntegrationError, RuntimeError):
    """A worker group returned a batch without the columns the next stage reads."""


class TrainerStateError(IntegrationError, RuntimeError):
    """The trainer used in a state that cannot serve the request: its worker groups asked
    for before ``init_workers`` or after ``close``, or a spawned role group that does not
    bind the methods of its role's class."""


class BackendMismatchError(IntegrationError, TypeError):
    """A resource pool, worker class or worker group of one backend given to another."""
