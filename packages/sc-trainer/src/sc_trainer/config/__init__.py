"""A run's configuration: typed dataclasses, validated when built.

:class:`TrainerConfig` holds every setting of one training run (its defaults are the
``sc-demo`` run), :class:`TaskConfig` the built-in task's shape and :class:`RunConfig` how
the run lives on a standing Ray cluster (a detached run). A field declared with
:func:`option` is also a command-line flag (:func:`add_options`, :func:`config_kwargs`).
"""

from sc_dispatch import _public

from .._errors import TaskError, TrainerConfigError
from ._fields import (
    ALGORITHMS,
    BACKENDS,
    DEVICES,
    PLACEMENTS,
    ROLLOUT_ENGINES,
    Algorithm,
    BackendName,
    Device,
    Placement,
    RolloutEngineName,
)
from ._options import GROUPS, Option, add_options, config_kwargs, option
from ._run import RUN_ID_PATTERN, RunConfig, check_run_id
from ._task import TASK_MODES, TaskConfig, TaskMode
from ._trainer import TrainerConfig

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BACKENDS",
    "BackendName",
    "DEVICES",
    "Device",
    "GROUPS",
    "Option",
    "PLACEMENTS",
    "Placement",
    "ROLLOUT_ENGINES",
    "RUN_ID_PATTERN",
    "RolloutEngineName",
    "RunConfig",
    "TASK_MODES",
    "TaskConfig",
    "TaskError",
    "TaskMode",
    "TrainerConfig",
    "TrainerConfigError",
    "add_options",
    "check_run_id",
    "config_kwargs",
    "option",
]

_public.publish(globals())
