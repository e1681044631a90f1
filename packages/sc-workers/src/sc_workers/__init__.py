"""sc-workers: training workers for the sc single controller (verl's workers, rebuilt).

* :class:`ActorRolloutRefWorker` and :class:`CriticWorker` — worker classes for a worker
  group (``sc_core.LocalWorkerGroup`` in-process, ``sc_ray.RayWorkerGroup`` on Ray);
* engines (:mod:`sc_workers.engine`) — FSDP2, and tensor x data parallel on a DeviceMesh;
* the built-in causal transformer and the optional Hugging Face models
  (:mod:`sc_workers.models`): :func:`hf_worker_configs` / :func:`hf_model_config` build
  configurations from a local model directory, :func:`load_hf_tokenizer` loads its
  tokenizer, the workers' ``export_hf_model`` and :func:`export_hf_checkpoint` write a
  ``save_pretrained`` directory back;
* the built-in rollout engine (:mod:`sc_workers.rollout`): :class:`TorchRolloutEngine`
  serves a local Hugging Face causal LM behind ``sc_rollout.RolloutEngine`` (continuous
  batching, versioned weight loads), ``python -m sc_workers.rollout`` in a server process;
* RL math (:mod:`sc_workers.algos`);
* typed configuration dataclasses, validated on construction.

Exceptions are described in :mod:`sc_workers._errors`. ``transformers`` is imported only
when a Hugging Face model is loaded (extra ``sc-workers[hf]``).
"""

from sc_dispatch import _public

from ._config import (
    LOSS_AGG_MODES,
    ActorConfig,
    ActorRolloutRefConfig,
    BatchSizes,
    ConfigBase,
    CriticConfig,
    FSDPConfig,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
    ParallelSizes,
    RefConfig,
    RolloutConfig,
)
from ._errors import (
    BatchError,
    CheckpointError,
    CollectiveAbortedError,
    ConfigError,
    DistributedError,
    MissingBatchKeyError,
    NotInitializedError,
    OptionalDependencyError,
    PipelineStageError,
    ScWorkersError,
    SyncLayoutError,
    UnsupportedParallelismError,
    WeightSyncError,
)
from ._hf_configs import hf_model_config, hf_worker_configs
from ._settings import SETTINGS
from .engine import Engine, FSDPEngine, MegatronEngine, ParallelLayout, make_engine
from .models import HFCausalLM, HFValueModel, TinyCausalLM, load_hf_tokenizer
from .rollout import TorchRolloutEngine, TorchRolloutEngineConfig
from .sync import WeightSync
from .workers import (
    ROLES,
    ActorRolloutRefWorker,
    CriticWorker,
    RolloutWorker,
    export_hf_checkpoint,
    published_step,
)

__version__ = "0.2.0"

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "ActorRolloutRefWorker",
    "BatchError",
    "BatchSizes",
    "CheckpointError",
    "CollectiveAbortedError",
    "ConfigBase",
    "ConfigError",
    "CriticConfig",
    "CriticWorker",
    "DistributedError",
    "Engine",
    "FSDPConfig",
    "FSDPEngine",
    "HFCausalLM",
    "HFValueModel",
    "LOSS_AGG_MODES",
    "MegatronConfig",
    "MegatronEngine",
    "MissingBatchKeyError",
    "ModelConfig",
    "NotInitializedError",
    "OptimConfig",
    "OptionalDependencyError",
    "ParallelLayout",
    "ParallelSizes",
    "PipelineStageError",
    "ROLES",
    "RefConfig",
    "RolloutConfig",
    "RolloutWorker",
    "SETTINGS",
    "ScWorkersError",
    "SyncLayoutError",
    "TinyCausalLM",
    "TorchRolloutEngine",
    "TorchRolloutEngineConfig",
    "UnsupportedParallelismError",
    "WeightSync",
    "WeightSyncError",
    "__version__",
    "export_hf_checkpoint",
    "hf_model_config",
    "hf_worker_configs",
    "load_hf_tokenizer",
    "make_engine",
    "published_step",
]

_public.publish(globals())
