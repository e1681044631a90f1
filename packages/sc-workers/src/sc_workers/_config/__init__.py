"""Typed configuration for the engines and workers.

The sections live in :mod:`._base` (what they share), :mod:`._model`, :mod:`._engine`
(optimizer, FSDP, megatron) and :mod:`._roles` (actor, rollout, reference, critic).

Every dataclass validates itself in ``__post_init__`` and raises :class:`ConfigError` with
the offending numbers. Checks that need the data-parallel size (batch sizes divisible by it)
run when a worker is constructed, through :meth:`ActorConfig.normalized_batch_sizes` and
:meth:`CriticConfig.normalized_batch_sizes`. Field names follow verl's configuration so
that a verl YAML section maps onto these classes with :meth:`ConfigBase.from_dict`.
"""

from ._base import LOSS_AGG_MODES, ConfigBase
from ._engine import FSDPConfig, MegatronConfig, OptimConfig
from ._model import ModelConfig
from ._roles import (
    ActorConfig,
    ActorRolloutRefConfig,
    BatchSizes,
    CriticConfig,
    ParallelSizes,
    RefConfig,
    RolloutConfig,
)

__all__ = [
    "LOSS_AGG_MODES",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "BatchSizes",
    "ConfigBase",
    "CriticConfig",
    "FSDPConfig",
    "MegatronConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelSizes",
    "RefConfig",
    "RolloutConfig",
]
