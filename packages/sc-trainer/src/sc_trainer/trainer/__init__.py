"""The training loop and what it is made of.

:class:`RayPPOTrainer` (verl's name) is the loop: ``init_workers`` builds one typed worker
group per :class:`Role` through a :class:`Launcher` and picks the run's rollout source
(:func:`make_rollout_source`), ``fit`` trains, one line per stage of the dataflow. The stages
that run on the driver (balancing, reward, advantages) are plain functions of a batch.
"""

from sc_dispatch import _public

from .._errors import (
    ExactModeMismatchError,
    TrainerStateError,
    TrainingDivergedError,
    WorkerOutputError,
)
from ._balance import balanced_order, shard_token_sums
from ._launcher import Launcher
from ._result import MetricsSink, ProgressFn, RunResult
from ._roles import (
    Role,
    RoleClasses,
    TrainerGroups,
    build_worker_groups,
    model_config,
    registered_method_names,
    role_classes,
    role_group,
    worker_configs,
)
from ._sources import make_rollout_source
from ._stages import (
    TIMING_PREFIXES,
    StageTimer,
    apply_rollout_correction,
    balance_batch,
    check_exact,
    check_finite,
    compute_advantage,
    compute_reward,
    log_prob_gap,
    metrics_of,
    response_metrics,
    rollout_mismatch,
)
from ._trainer import RayPPOTrainer

__all__ = [
    "ExactModeMismatchError",
    "Launcher",
    "MetricsSink",
    "ProgressFn",
    "RayPPOTrainer",
    "Role",
    "RoleClasses",
    "RunResult",
    "StageTimer",
    "TIMING_PREFIXES",
    "TrainerGroups",
    "TrainerStateError",
    "TrainingDivergedError",
    "WorkerOutputError",
    "apply_rollout_correction",
    "balance_batch",
    "balanced_order",
    "build_worker_groups",
    "check_exact",
    "check_finite",
    "compute_advantage",
    "compute_reward",
    "log_prob_gap",
    "make_rollout_source",
    "metrics_of",
    "model_config",
    "registered_method_names",
    "response_metrics",
    "role_classes",
    "role_group",
    "rollout_mismatch",
    "shard_token_sums",
    "worker_configs",
]

_public.publish(globals())
