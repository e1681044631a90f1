"""sc-integration: the reference RL trainer and the ``sc-demo`` command (never published).

The trainer drives PPO or GRPO from one process in the single-controller style: a
:class:`TaskRunner` maps roles to resource pools and builds a :class:`RayPPOTrainer`, whose
``init_workers`` creates the worker groups and whose ``fit`` runs the training loop, one line
per stage. The toy task (:class:`DigitsTask`) has a verifiable reward that the tiny
built-in model of sc-workers learns from scratch on a couple of CPU cores.
"""

from ._balance import balanced_order, shard_token_sums
from ._config import ALGORITHMS, BACKENDS, DEVICES, Algorithm, Backend, Device, TrainerConfig
from ._errors import (
    BackendMismatchError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    ScIntegrationError,
    StalenessBoundError,
    TaskError,
    TrainerConfigError,
    TrainerRecoveryError,
    TrainerStateError,
    TrainingDivergedError,
    WorkerOutputError,
)
from ._faults import FaultSpec
from ._launchers import InProcessLauncher, Launcher, RayLauncher, make_launcher
from ._output import PLOT_PANELS, RunOutput, check_resumable, read_metrics, resolve_checkpoint
from ._roles import Role
from ._runner import TaskRunner, make_task
from ._settings import SETTINGS
from ._task import TASK_MODES, CharTokenizer, DigitsTask, TaskConfig, TaskMode
from ._text_task import TextDigitsTask
from ._trainer import RayPPOTrainer, RunResult

__all__ = [
    "FaultSpec",
    "SETTINGS",
    "ALGORITHMS",
    "BACKENDS",
    "DEVICES",
    "PLOT_PANELS",
    "TASK_MODES",
    "Algorithm",
    "Backend",
    "BackendMismatchError",
    "CharTokenizer",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "Device",
    "InProcessLauncher",
    "Launcher",
    "RayLauncher",
    "RayPPOTrainer",
    "DigitsTask",
    "Role",
    "RunResult",
    "ScIntegrationError",
    "StalenessBoundError",
    "RunOutput",
    "TaskConfig",
    "TaskError",
    "TaskMode",
    "TaskRunner",
    "TextDigitsTask",
    "TrainerConfig",
    "TrainerConfigError",
    "TrainerRecoveryError",
    "TrainerStateError",
    "TrainingDivergedError",
    "WorkerOutputError",
    "balanced_order",
    "check_resumable",
    "make_launcher",
    "make_task",
    "read_metrics",
    "resolve_checkpoint",
    "shard_token_sums",
]
