"""FSDP engine: torch FSDP2 (``fully_shard``) over a 1-D dp mesh, or a 2-D mesh for HSDP."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from .._errors import ConfigError
from ._base import Engine
from ._modules import block_modules, param_dtype_for

__all__ = ["FSDPEngine", "mixed_precision_policy", "shard_module"]

_REDUCE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def mixed_precision_policy(engine: Engine) -> MixedPrecisionPolicy:
    param_dtype = param_dtype_for(engine.fsdp_config.param_dtype, engine.device)
    return MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=_REDUCE[engine.fsdp_config.reduce_dtype]
    )


def shard_module(engine: Engine, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """``fully_shard`` every transformer block, then the root module, over ``mesh``."""
    policy = mixed_precision_policy(engine)
    reshard = engine.fsdp_config.reshard_after_forward
    for block in block_modules(module):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    return module


class FSDPEngine(Engine):
    """Data parallelism with sharded parameters, gradients and optimizer state (FSDP2).

    Every rank is its own dp rank (tp size 1). ``fsdp_config.fsdp_size`` smaller than the
    world size gives HSDP: a ``(replicate, shard)`` mesh, parameters sharded within groups
    of ``fsdp_size`` ranks and replicated across groups.
    """

    strategy = "fsdp"

    def _make_mesh(self) -> DeviceMesh:
        world = self.layout.world_size
        if self.layout.tp_size != 1:
            raise ConfigError(
                f"rank {self.layout.rank}: the fsdp engine has no tensor parallelism, got tp size "
                f"{self.layout.tp_size}; use strategy 'megatron'"
            )
        fsdp_size = self.fsdp_config.fsdp_size
        if fsdp_size in (-1, world):
            return init_device_mesh(self.device.type, (world,), mesh_dim_names=("dp",))
        if world % fsdp_size:
            raise ConfigError(
                f"fsdp_config.fsdp_size {fsdp_size} does not divide the dp size {world}"
            )
        return init_device_mesh(
            self.device.type,
            (world // fsdp_size, fsdp_size),
            mesh_dim_names=("dp_replicate", "dp_shard"),
        )

    def _parallelize(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
        return shard_module(self, module, mesh)

    @property
    def dp_group(self) -> dist.ProcessGroup:
        group = dist.group.WORLD
        if group is None:  # pragma: no cover - build() initialises the default group
            raise RuntimeError("torch.distributed is not initialised")
        return group
