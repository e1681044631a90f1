"""Engines: a sharded model with its optimizer, behind one small interface.

* :class:`FSDPEngine` — FSDP2 over a dp mesh (HSDP with ``fsdp_size``);
* :class:`MegatronEngine` — tensor parallelism x FSDP2 on a ``(dp, tp)`` mesh;
* :class:`PipelineEngine` — pipeline stages x tensor parallelism x FSDP2 on a
  ``(pp, dp, tp)`` mesh (megatron with ``pipeline_model_parallel_size`` > 1);
* :class:`ReplicatedTPEngine` — tensor parallelism x full replicas (a rollout group).

:func:`make_engine` picks one from a strategy name ("fsdp", "fsdp2" or "megatron").
"""

from __future__ import annotations

import torch
from sc_dispatch import _public

from .._config import FSDPConfig, MegatronConfig, ModelConfig, OptimConfig
from .._errors import ConfigError
from ._base import Engine
from ._fsdp import FSDPEngine
from ._megatron import (
    MegatronEngine,
    ReplicatedTPEngine,
    decoder_layer_plan,
    parallelize_hf_model,
    tensor_parallel_plan,
)
from ._modules import block_modules
from ._optim import warmup_lr_lambda
from ._parallel import ParallelLayout, init_distributed, resolve_device
from ._pipeline import PipelineEngine, PipelineModel

__all__ = [
    "Engine",
    "FSDPEngine",
    "MegatronEngine",
    "ParallelLayout",
    "PipelineEngine",
    "PipelineModel",
    "ReplicatedTPEngine",
    "block_modules",
    "decoder_layer_plan",
    "init_distributed",
    "make_engine",
    "parallelize_hf_model",
    "resolve_device",
    "tensor_parallel_plan",
    "warmup_lr_lambda",
]


def make_engine(
    strategy: str,
    model_config: ModelConfig,
    fsdp_config: FSDPConfig,
    layout: ParallelLayout,
    device: torch.device,
    optim_config: OptimConfig | None = None,
    value_head: bool = False,
    megatron: MegatronConfig | None = None,
) -> Engine:
    """An (unbuilt) engine for ``strategy``; call :meth:`Engine.build` to create the model.

    "megatron" with ``layout.pp_size`` > 1 is a :class:`PipelineEngine`, whose virtual
    stages and schedule come from ``megatron``."""
    if strategy == "megatron" and layout.pp_size > 1:
        return PipelineEngine(
            model_config, fsdp_config, layout, device, optim_config, value_head, megatron
        )
    cls: type[Engine]
    if strategy in ("fsdp", "fsdp2"):
        cls = FSDPEngine
    elif strategy == "megatron":
        cls = MegatronEngine
    else:
        raise ConfigError(f"strategy must be 'fsdp', 'fsdp2' or 'megatron', got {strategy!r}")
    return cls(model_config, fsdp_config, layout, device, optim_config, value_head)


_public.publish(globals())
