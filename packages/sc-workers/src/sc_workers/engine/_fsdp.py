"""FSDP engine: torch FSDP2 (``fully_shard``) over a 1-D dp mesh, a 2-D mesh for HSDP, or
a ``(dp, sp)`` mesh with Ulysses sequence parallelism."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from .._errors import ConfigError, UnsupportedParallelismError
from ..models import HFCausalLM, HFValueModel, TinyCausalLM
from ..models._hf_ulysses import enable_hf_sequence_parallel
from ..models._ulysses import SequenceParallel
from ._base import Engine
from ._modules import block_modules, param_dtype_for

__all__ = ["FSDPEngine", "mixed_precision_policy", "prepare_sequence_parallel", "shard_module"]

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


def prepare_sequence_parallel(module: nn.Module, sp: int, where: str) -> None:
    """Check that ``module`` can run sequence-sharded over ``sp`` ranks (its attention heads
    divide by ``sp``: :class:`ConfigError` otherwise) and, for a transformers model, switch
    its attention to the Ulysses one. Other modules raise
    :class:`UnsupportedParallelismError`."""
    if isinstance(module, TinyCausalLM):
        heads = module.config.num_attention_heads
        if heads % sp:
            raise ConfigError(
                f"{where}: model.num_attention_heads {heads} is not divisible by "
                f"ulysses_sequence_parallel_size {sp}"
            )
    elif isinstance(module, (HFCausalLM, HFValueModel)):
        enable_hf_sequence_parallel(module, sp, where)
    else:
        raise UnsupportedParallelismError(
            f"{where}: Ulysses sequence parallelism is not implemented for {type(module).__name__}"
        )


class FSDPEngine(Engine):
    """Data parallelism with sharded parameters, gradients and optimizer state (FSDP2).

    Without sequence parallelism every rank is its own dp rank. ``fsdp_config.fsdp_size``
    smaller than the world size gives HSDP: a ``(dp_replicate, dp_shard)`` mesh, parameters
    sharded within groups of ``fsdp_size`` ranks and replicated across groups.

    With ``ulysses_sequence_parallel_size`` sp > 1 the mesh is ``(dp, sp)`` (sp ranks
    adjacent): the sp ranks of one dp group hold the same batch and each runs one shard of
    every sequence (:mod:`sc_workers.models._ulysses`). Parameters are still sharded over
    every rank of the world (FSDP2 on a 1-D mesh of all dp x sp ranks), and FSDP averages
    gradients over all of them (:attr:`Engine.grad_average_ranks`). HSDP is not combined
    with sp.
    """

    strategy = "fsdp"

    def _where(self) -> str:
        sp = self.layout.sp_size
        where = f"FSDPEngine.build (rank {self.layout.rank}): ulysses_sequence_parallel_size {sp}"
        if self.model_config.path is not None:
            where += f", model {self.model_config.path!r}"
        return where

    def _check_layout(self) -> None:
        if self.layout.tp_size != 1:
            raise ConfigError(
                f"rank {self.layout.rank}: the fsdp engine has no tensor parallelism, got tp size "
                f"{self.layout.tp_size}; use strategy 'megatron'"
            )
        world, fsdp_size = self.layout.world_size, self.fsdp_config.fsdp_size
        if self.layout.sp_size > 1 and fsdp_size not in (-1, world):
            raise ConfigError(
                f"{self._where()}: fsdp_config.fsdp_size {fsdp_size} (HSDP) is not combined "
                f"with sequence parallelism; use -1 (shard over all {world} ranks)"
            )
        if fsdp_size not in (-1, world) and world % fsdp_size:
            raise ConfigError(
                f"fsdp_config.fsdp_size {fsdp_size} does not divide the dp size {world}"
            )

    def _make_mesh(self) -> DeviceMesh:
        world, sp = self.layout.world_size, self.layout.sp_size
        if sp > 1:
            return init_device_mesh(
                self.device.type, (self.layout.dp_size, sp), mesh_dim_names=("dp", "sp")
            )
        fsdp_size = self.fsdp_config.fsdp_size
        if fsdp_size in (-1, world):
            return init_device_mesh(self.device.type, (world,), mesh_dim_names=("dp",))
        return init_device_mesh(
            self.device.type,
            (world // fsdp_size, fsdp_size),
            mesh_dim_names=("dp_replicate", "dp_shard"),
        )

    def _parallelize(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
        sp = self.layout.sp_size
        if sp == 1:
            return shard_module(self, module, mesh)
        prepare_sequence_parallel(module, sp, self._where())
        self.sequence_parallel = SequenceParallel.of_group(mesh.get_group("sp"))
        if self.sequence_parallel.rank != self.layout.sp_rank:  # pragma: no cover - mesh order
            raise ConfigError(
                f"{self._where()}: the mesh puts this rank at sp rank "
                f"{self.sequence_parallel.rank}, the layout at {self.layout.sp_rank}"
            )
        world = init_device_mesh(
            self.device.type, (self.layout.world_size,), mesh_dim_names=("fsdp",)
        )
        return shard_module(self, module, world)

    @property
    def dp_group(self) -> dist.ProcessGroup:
        if self.layout.sp_size > 1:
            mesh = self.device_mesh
            if mesh is None:
                raise ConfigError(f"rank {self.layout.rank}: the fsdp engine is not built")
            return mesh.get_group("dp")
        group = dist.group.WORLD
        if group is None:  # pragma: no cover - build() initialises the default group
            raise RuntimeError("torch.distributed is not initialised")
        return group
