"""sc-integration: the reference RL trainer and the ``sc-demo`` command (never published).

The trainer drives PPO or GRPO from one process in the single-controller style: a
:class:`TaskRunner` maps roles to resource pools and builds a :class:`RayPPOTrainer`, whose
``init_workers`` creates the worker groups and whose ``fit`` runs the training loop, one line
per stage. The toy task (:class:`DigitsTask`) has a verifiable reward that the tiny
built-in model of sc-workers learns from scratch on a couple of CPU cores.

Rollout servers (sc-rollout) for the trainer: :class:`RolloutServerFleet` places server
processes on a Ray resource pool behind a router, :class:`WeightPublisher` writes and pushes
each weight version, :class:`RouterRollout` runs ``generate_sequences`` on the driver over the
router, and :class:`PartialRollout` keeps generating across weight updates under a staleness
bound.

Agents (``sc-demo --task tool-calc``): :class:`AgentRollout` makes each step's batch of
multi-turn agent sessions (an :class:`AgentEnvironment`, such as :class:`ToolCalcTask`) on the
rollout servers with :class:`sc_rollout.AgentLoop`; :func:`build_agent_batch` lays the
sessions out as rows whose ``response_mask`` leaves the tool tokens out of the loss.

Detached runs (``sc-demo --run-id ID --address ADDR``, :class:`RunConfig`): the workers live
on a standing Ray cluster under names derived from the run id and outlive the driver; a new
driver re-attaches (:class:`DetachedRayLauncher`, :class:`RunSession`) and replays the step
in flight exactly once from the run state written at each step boundary (:class:`RunState`).
"""

from ._agent_batch import agent_token_scores, build_agent_batch
from ._agent_rollout import AgentEnvironment, AgentRollout
from ._balance import balanced_order, shard_token_sums
from ._config import ALGORITHMS, BACKENDS, DEVICES, Algorithm, Backend, Device, TrainerConfig
from ._driver_faults import DRIVER_PHASES, DriverFault
from ._errors import (
    AgentRolloutError,
    BackendMismatchError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    RolloutFleetError,
    RolloutInputError,
    RunStateNotFoundError,
    ScIntegrationError,
    StalenessBoundError,
    TaskError,
    TrainerConfigError,
    TrainerRecoveryError,
    TrainerStateError,
    TrainingDivergedError,
    WeightPublishError,
    WorkerOutputError,
)
from ._faults import FaultSpec
from ._launchers import (
    DetachedRayLauncher,
    InProcessLauncher,
    Launcher,
    RayLauncher,
    make_launcher,
)
from ._output import PLOT_PANELS, RunOutput, check_resumable, read_metrics, resolve_checkpoint
from ._partial_rollout import ON_STALE, OnStale, PartialRollout
from ._roles import Role
from ._rollout_servers import ArgvFactory, RolloutServerActor, RolloutServerFleet
from ._router_rollout import PendingBatch, RouterRollout, RouterSampling
from ._run_config import RunConfig
from ._run_session import RunSession
from ._run_state import RUN_STATE, AsyncState, RunState, read_run_state
from ._runner import TaskRunner, make_task
from ._settings import SETTINGS
from ._task import TASK_MODES, CharTokenizer, DigitsTask, TaskConfig, TaskMode
from ._text_task import TextDigitsTask
from ._tool_task import TOOL_CALC_CHARS, ToolCalcTask
from ._trainer import RayPPOTrainer, RunResult
from ._weight_publisher import WEIGHTS_FILE, WeightPublisher

__all__ = [
    "AgentEnvironment",
    "AgentRollout",
    "AgentRolloutError",
    "TOOL_CALC_CHARS",
    "ToolCalcTask",
    "agent_token_scores",
    "build_agent_batch",
    "FaultSpec",
    "SETTINGS",
    "ALGORITHMS",
    "ArgvFactory",
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
    "ON_STALE",
    "OnStale",
    "PartialRollout",
    "PendingBatch",
    "RayLauncher",
    "RayPPOTrainer",
    "DigitsTask",
    "Role",
    "RolloutFleetError",
    "RolloutInputError",
    "RolloutServerActor",
    "RolloutServerFleet",
    "RouterRollout",
    "RouterSampling",
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
    "WEIGHTS_FILE",
    "WeightPublishError",
    "WeightPublisher",
    "WorkerOutputError",
    "DRIVER_PHASES",
    "DetachedRayLauncher",
    "DriverFault",
    "RUN_STATE",
    "AsyncState",
    "RunConfig",
    "RunSession",
    "RunState",
    "RunStateNotFoundError",
    "read_run_state",
    "balanced_order",
    "check_resumable",
    "make_launcher",
    "make_task",
    "read_metrics",
    "resolve_checkpoint",
    "shard_token_sums",
]
