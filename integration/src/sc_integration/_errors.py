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
    └── WorkerOutputError (RuntimeError)      a worker group returned a batch without the
                                              columns the next stage reads

Messages name the method or option and the offending value.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "IntegrationError",
    "TaskError",
    "TrainerConfigError",
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
