"""Megatron-style engine: tensor parallelism (DTensor) x data parallelism (FSDP2).

A ``(dp, tp)`` DeviceMesh; rank = dp_rank * tp + tp_rank. Attention q/k/v and the MLP
gate/up projections are column-parallel, the attention output and MLP down projections
row-parallel, so each block needs one all-reduce in attention and one in the MLP.
Embeddings, norms and the output head are replicated over tp. FSDP2 then shards every
parameter over the dp dimension. Pipeline parallelism is not implemented
(:class:`~sc_workers.MegatronConfig` rejects ``pipeline_model_parallel_size`` > 1).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from .._errors import ConfigError, UnsupportedParallelismError
from ..models import TinyCausalLM
from ._base import Engine
from ._fsdp import shard_module

__all__ = ["MegatronEngine", "tensor_parallel_plan"]


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
        tp = self.layout.tp_size
        if tp > 1:
            if not isinstance(module, TinyCausalLM):
                raise UnsupportedParallelismError(
                    f"tensor_model_parallel_size {tp} is only implemented for the built-in "
                    f"model, not {type(module).__name__}"
                )
            parallelize_module(module, mesh["tp"], tensor_parallel_plan())
        return shard_module(self, module, mesh["dp"])

    @property
    def dp_group(self) -> dist.ProcessGroup:
        mesh = self.device_mesh
        if mesh is None:
            raise ConfigError("the megatron engine is not built")
        return mesh.get_group("dp")
