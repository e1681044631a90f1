"""Megatron-style engine: tensor parallelism (DTensor) x data parallelism (FSDP2).

A ``(dp, tp)`` DeviceMesh; rank = dp_rank * tp + tp_rank. Attention q/k/v and the MLP
gate/up projections are column-parallel, the attention output and MLP down projections
row-parallel, so each block needs one all-reduce in attention and one in the MLP. Norms
are replicated over tp. In the built-in model the embeddings and the output head are
replicated too; in a Hugging Face model with untied embeddings whose vocabulary divides by
tp, the input embedding is split by vocabulary rows (one all-reduce) and the output head
by vocabulary columns (logits all-gathered, so every tp rank sees the full vocabulary).
FSDP2 then shards every parameter over the dp dimension. Pipeline stages
(:class:`~sc_workers.engine.PipelineEngine`) are split the same way, one stage at a time.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from .._errors import ConfigError, UnsupportedParallelismError
from ..models import (
    HFCausalLM,
    HFStage,
    HFValueModel,
    TinyCausalLM,
    TinyStage,
    check_hf_tensor_parallel,
)
from ._base import Engine
from ._fsdp import shard_module
from ._modules import block_modules

__all__ = [
    "MegatronEngine",
    "ReplicatedTPEngine",
    "decoder_layer_plan",
    "parallelize_hf_model",
    "tensor_parallel_plan",
]

#: attributes some transformers attention classes keep for their (now local) head counts
_HEAD_COUNT_ATTRS = ("num_heads", "num_key_value_heads")


def tensor_parallel_plan() -> dict[str, ParallelStyle]:
    """The column/row-parallel plan for the built-in model's blocks."""
    col, row = ColwiseParallel, RowwiseParallel
    return {
        "layers.*.self_attn.q_proj": col(),
        "layers.*.self_attn.k_proj": col(),
        "layers.*.self_attn.v_proj": col(),
        "layers.*.self_attn.o_proj": row(),
        "layers.*.mlp.gate_proj": col(),
        "layers.*.mlp.up_proj": col(),
        "layers.*.mlp.down_proj": row(),
    }


def decoder_layer_plan() -> dict[str, ParallelStyle]:
    """The column/row-parallel plan of one Llama/Qwen2-style decoder layer (relative names)."""
    col, row = ColwiseParallel, RowwiseParallel
    return {
        "self_attn.q_proj": col(),
        "self_attn.k_proj": col(),
        "self_attn.v_proj": col(),
        "self_attn.o_proj": row(),
        "mlp.gate_proj": col(),
        "mlp.up_proj": col(),
        "mlp.down_proj": row(),
    }


def _submodule(layer: nn.Module, name: str) -> nn.Module | None:
    try:
        return layer.get_submodule(name)
    except AttributeError:
        return None


def _vocab_modules(module: HFCausalLM | HFValueModel | HFStage) -> tuple[Any, Any]:
    """The input embedding and the causal LM's output head that ``module`` holds (None
    where it has none: a critic's head, a pipeline stage's missing ends)."""
    if isinstance(module, HFStage):
        return module.embed_tokens, module.output_head
    hf_model: Any = module.model
    embed = hf_model.get_input_embeddings()
    head = hf_model.get_output_embeddings() if isinstance(module, HFCausalLM) else None
    return embed, head


def parallelize_hf_model(
    module: HFCausalLM | HFValueModel | HFStage, tp_mesh: DeviceMesh, where: str
) -> None:
    """Apply tensor parallelism to a transformers decoder-only model, in place.

    Every decoder layer (:func:`~sc_workers.engine.block_modules`) gets
    :func:`decoder_layer_plan`; its attention runs on ``num_attention_heads / tp`` query
    heads and ``num_key_value_heads / tp`` key/value heads (transformers' Llama-style
    attention infers the local head count from the projection width; attention classes
    that keep head counts as attributes get them divided). Untied embeddings whose
    vocabulary divides by tp are split over the vocabulary; tied ones stay replicated.
    ``module`` may be one pipeline stage (:class:`~sc_workers.models.HFStage`): its layers,
    and the embedding or output head it holds, are split the same way.
    Raises :class:`ConfigError` when a head count or the MLP width does not divide by tp,
    and :class:`UnsupportedParallelismError` for a layer without the Llama-style
    projections.
    """
    tp = tp_mesh.size()
    check_hf_tensor_parallel(module.hf_config, tp, where)
    layers = block_modules(module)
    if not layers:
        owner = module if isinstance(module, HFStage) else module.model
        raise UnsupportedParallelismError(
            f"{where}: found no decoder layers in {type(owner).__name__}"
        )
    plan = decoder_layer_plan()
    for layer in layers:
        missing = [n for n in plan if not isinstance(_submodule(layer, n), nn.Linear)]
        if missing:
            raise UnsupportedParallelismError(
                f"{where}: {type(layer).__name__} has no linear layers {missing}; the "
                "tensor-parallel plan covers Llama/Qwen2-style decoder layers"
            )
        parallelize_module(layer, tp_mesh, decoder_layer_plan())
        attention = layer.get_submodule("self_attn")
        for attr in _HEAD_COUNT_ATTRS:
            value = getattr(attention, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(attention, attr, value // tp)
    embed, head = _vocab_modules(module)
    if embed is not None and head is not None and head.weight is embed.weight:
        return  # tied: replicated
    if embed is not None and int(embed.weight.shape[0]) % tp == 0:
        parallelize_module(embed, tp_mesh, RowwiseParallel(input_layouts=Replicate()))
    if head is not None and int(head.weight.shape[0]) % tp == 0:
        parallelize_module(head, tp_mesh, ColwiseParallel(output_layouts=Replicate()))


class MegatronEngine(Engine):
    """Tensor parallelism x FSDP2 data parallelism on a 2-D ``(dp, tp)`` mesh."""

    strategy = "megatron"

    def _make_mesh(self) -> DeviceMesh:
        if self.fsdp_config.fsdp_size not in (-1, self.layout.dp_size):
            raise ConfigError(
                f"fsdp_config.fsdp_size {self.fsdp_config.fsdp_size}: HSDP is not combined with "
                f"tensor parallelism; use -1 (shard over the dp size {self.layout.dp_size})"
            )
        return init_device_mesh(
            self.device.type,
            (self.layout.dp_size, self.layout.tp_size),
            mesh_dim_names=("dp", "tp"),
        )

    def _parallelize(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
        return shard_module(self, self._tensor_parallel(module, mesh), mesh["dp"])

    def _tensor_parallel(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
        """Split ``module``'s layers over the mesh's "tp" dimension (in place)."""
        tp = self.layout.tp_size
        if tp > 1:
            where = f"rank {self.layout.rank}: tensor_model_parallel_size {tp}"
            if isinstance(module, (TinyCausalLM, TinyStage)):
                parallelize_module(module, mesh["tp"], tensor_parallel_plan())
            elif isinstance(module, (HFCausalLM, HFValueModel, HFStage)):
                where += f", model {self.model_config.path!r}"
                parallelize_hf_model(module, mesh["tp"], where)
            else:
                raise UnsupportedParallelismError(
                    f"{where} is not implemented for {type(module).__name__}"
                )
        return module

    @property
    def dp_group(self) -> dist.ProcessGroup:
        mesh = self.device_mesh
        if mesh is None:
            raise ConfigError("the megatron engine is not built")
        return mesh.get_group("dp")


class ReplicatedTPEngine(MegatronEngine):
    """Tensor parallelism inside each replica, full copies across replicas: the layout of a
    rollout group (an inference engine, no FSDP). The mesh is ``(dp, tp)`` as in
    :class:`MegatronEngine`; its dp dimension counts replicas."""

    strategy = "tp-replicated"

    def _parallelize(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
        return self._tensor_parallel(module, mesh)

    @property
    def step_group(self) -> dist.ProcessGroup | None:
        """One replica's tensor-parallel ranks: replicas generate independently (a slow or
        dead replica does not hold the others up)."""
        mesh = self.device_mesh
        if mesh is None:
            raise ConfigError("the replicated tensor-parallel engine is not built")
        return mesh.get_group("tp")
