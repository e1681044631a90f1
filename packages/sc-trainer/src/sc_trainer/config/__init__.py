"""A run's configuration: typed dataclasses, validated when built, and the config file.

:class:`TrainerConfig` holds every setting of one training run (its defaults are the
``sc-demo`` run): :class:`DataConfig` (the user's dataset), :class:`RewardConfig` (its reward
function), :class:`TrackingConfig` (experiment trackers), :class:`RolloutCorrectionConfig` (the
rollout-training mismatch corrections), :class:`TaskConfig` (the built-in
task, without data) and :class:`RunConfig` (a detached run on a standing Ray cluster). A
field declared with :func:`option` is also an ``sc-demo`` flag (:func:`add_options`,
:func:`config_kwargs`). A config file uses verl's keys (:data:`KEYS`):
:func:`load_document` and :func:`parse_overrides` read a YAML file and ``key=value``
overrides, :func:`config_from_document` builds the configuration, :func:`write_document`
writes the resolved one back, which builds the same configuration again.
"""

from sc_dispatch import _public

from .._errors import TaskError, TrainerConfigError
from ._fields import (
    ALGORITHMS,
    BACKENDS,
    DEVICES,
    PLACEMENTS,
    RESUME_MODES,
    ROLLOUT_ENGINES,
    Algorithm,
    BackendName,
    Device,
    Placement,
    ResumeMode,
    RolloutEngineName,
)
from ._file import (
    TRAIN_DEFAULTS,
    config_from_dict,
    config_from_document,
    load_document,
    parse_overrides,
    resolved_document,
    write_document,
)
from ._keys import KEYS, Key
from ._options import GROUPS, Option, add_options, config_kwargs, option
from ._run import RUN_ID_PATTERN, RunConfig, check_run_id
from ._sections import (
    LOGGERS,
    ON_REWARD_ERROR,
    TRUNCATIONS,
    DataConfig,
    OnRewardError,
    RewardConfig,
    RolloutCorrectionConfig,
    TrackingConfig,
    Truncation,
)
from ._task import TASK_MODES, TaskConfig, TaskMode
from ._trainer import TrainerConfig

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BACKENDS",
    "BackendName",
    "DEVICES",
    "DataConfig",
    "Device",
    "GROUPS",
    "KEYS",
    "Key",
    "LOGGERS",
    "ON_REWARD_ERROR",
    "OnRewardError",
    "Option",
    "PLACEMENTS",
    "Placement",
    "RESUME_MODES",
    "ROLLOUT_ENGINES",
    "RUN_ID_PATTERN",
    "ResumeMode",
    "RewardConfig",
    "RolloutCorrectionConfig",
    "RolloutEngineName",
    "RunConfig",
    "TASK_MODES",
    "TRAIN_DEFAULTS",
    "TRUNCATIONS",
    "TaskConfig",
    "TaskError",
    "TaskMode",
    "TrackingConfig",
    "TrainerConfig",
    "TrainerConfigError",
    "Truncation",
    "add_options",
    "check_run_id",
    "config_from_dict",
    "config_from_document",
    "config_kwargs",
    "load_document",
    "option",
    "parse_overrides",
    "resolved_document",
    "write_document",
]

_public.publish(globals())
