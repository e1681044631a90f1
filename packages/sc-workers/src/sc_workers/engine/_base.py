"""The engine interface: a sharded model, its optimizer and schedule, and its layout.

The pieces an engine is made of live next to it: the model it creates and its blocks
(:mod:`._modules`), the optimizer, schedule and global gradient clipping (:mod:`._optim`),
and its checkpoint state (:mod:`._state`). Subclasses add the mesh and the parallelisation.
"""

from __future__ import annotations

import contextlib
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.optim.lr_scheduler import LambdaLR

from .._config import FSDPConfig, ModelConfig, OptimConfig
from .._errors import NotInitializedError
from ..models import HFCausalLM, HFModelKind, HFValueModel
from ..models._ulysses import SequenceParallel, sharded_forward
from ._modules import create_module
from ._optim import clip_grad_norm, make_optimizer
from ._parallel import ParallelLayout, init_distributed
from ._state import load_local_state_dict, local_state_dict

__all__ = ["Engine"]

logger = logging.getLogger(__name__)


class Engine(ABC):
    """A model sharded over a device mesh, with AdamW and a warmup schedule when training.

    Subclasses decide the mesh and how the model is parallelised (:class:`FSDPEngine`,
    :class:`MegatronEngine`). Call :meth:`build` once (it joins the process group); then
    :meth:`forward`, and for training :meth:`optimizer_step` after the backward passes.
    """

    strategy: str = "base"

    def __init__(
        self,
        model_config: ModelConfig,
        fsdp_config: FSDPConfig,
        layout: ParallelLayout,
        device: torch.device,
        optim_config: OptimConfig | None = None,
        value_head: bool = False,
    ) -> None:
        self.model_config = model_config
        self.fsdp_config = fsdp_config
        self.layout = layout
        self.device = device
        self.optim_config = optim_config
        self.value_head = value_head
        self._module: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: LambdaLR | None = None
        self.device_mesh: DeviceMesh | None = None
        #: this rank's Ulysses group, set by an engine that shards sequences (sp size > 1)
        self.sequence_parallel: SequenceParallel | None = None
        self._params_on_device = True
        self._optim_on_device = True
        #: the parameters as sharded at build time, by name: what the module holds between
        #: calls (during a forward or backward FSDP registers unsharded ones in their place)
        self._sharded_params: dict[str, nn.Parameter] = {}

    # ----------------------------------------------------------------- layout
    def get_data_parallel_rank(self) -> int:
        return self.layout.dp_rank

    def get_data_parallel_size(self) -> int:
        return self.layout.dp_size

    def is_mp_src_rank_with_outputs(self) -> bool:
        """Whether this rank's outputs are collected (tp rank 0, last pipeline stage)."""
        return self.layout.is_collect

    @property
    @abstractmethod
    def dp_group(self) -> dist.ProcessGroup:
        """The process group over which the batch is split (for global token counts)."""

    @property
    def grad_average_ranks(self) -> int:
        """How many ranks FSDP averages every gradient over: the dp ranks times the sp ranks
        of each (every rank it shards or replicates parameters over; tp ranks hold other
        parts of the same parameters). A loss normalised by dp-global counts is multiplied
        by this, so that the averaged gradient is the sum over the whole batch."""
        return self.layout.dp_size * self.layout.sp_size

    @property
    def step_group(self) -> dist.ProcessGroup | None:
        """The ranks that must run every forward together (each is a collective among them),
        so generation takes the same number of steps on all of them; ``None``: every rank
        of the process group (a sharded model)."""
        return None

    # ------------------------------------------------------------------ build
    @property
    def module(self) -> nn.Module:
        if self._module is None:
            raise NotInitializedError(
                f"rank {self.layout.rank}: the {self.strategy} engine is not built; call "
                "init_model first"
            )
        return self._module

    @property
    def built(self) -> bool:
        return self._module is not None

    def _create_module(self) -> nn.Module:
        return create_module(self.model_config, self.value_head)

    def _check_layout(self) -> None:
        """Reject a layout or setting this engine cannot run, before joining any group
        (the base engine accepts every layout; subclasses narrow it)."""
        return None

    @abstractmethod
    def _make_mesh(self) -> DeviceMesh: ...

    @abstractmethod
    def _parallelize(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module: ...

    def build(self) -> None:
        """Join the process group, create and shard the model, and set up the optimizer."""
        if self._module is not None:
            return
        self._check_layout()
        init_distributed(self.layout.world_size, self.layout.rank, self.device)
        mesh = self._make_mesh()
        self.device_mesh = mesh
        module = self._create_module().to(self.device)
        self._module = self._parallelize(module, mesh)
        self._sharded_params = dict(self._module.named_parameters())
        if self.optim_config is not None:
            self.optimizer, self.lr_scheduler = make_optimizer(
                self._module.parameters(), self.optim_config
            )
        logger.info(
            "rank %d: built %s engine (dp %d/%d, sp %d/%d, tp %d/%d) on %s",
            self.layout.rank,
            self.strategy,
            self.layout.dp_rank,
            self.layout.dp_size,
            self.layout.sp_rank,
            self.layout.sp_size,
            self.layout.tp_rank,
            self.layout.tp_size,
            self.device,
        )

    # ---------------------------------------------------------------- compute
    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: Any = None,
    ) -> Tensor:
        """Logits ``[b, s, vocab]`` (or values ``[b, s]``) for the given tokens.

        With a Ulysses group (:attr:`sequence_parallel`) and no cache, each sp rank runs its
        shard of the (right-padded) sequence and every rank returns the full output; with a
        cache (generation) every rank runs the whole sequence.
        """
        sp = self.sequence_parallel
        if sp is not None and cache is None:
            return sharded_forward(
                self.module,
                sp,
                input_ids.to(self.device),
                attention_mask.to(self.device),
                position_ids.to(self.device),
            )
        out: Tensor = self.module(
            input_ids.to(self.device),
            attention_mask.to(self.device),
            position_ids.to(self.device),
            cache,
        )
        return out

    @property
    def supports_kv_cache(self) -> bool:
        return bool(getattr(self.module, "supports_kv_cache", False))

    def new_cache(self) -> Any:
        """An empty key/value cache for :meth:`forward`, or None if the model has none."""
        if not self.supports_kv_cache:
            return None
        factory = getattr(self.module, "new_cache", None)
        return factory() if callable(factory) else None

    @property
    def hf_kind(self) -> HFModelKind | None:
        """The kind of Hugging Face model ("causal_lm", "value_model"); None if built in."""
        module = self.module
        if isinstance(module, HFCausalLM):
            return "causal_lm"
        if isinstance(module, HFValueModel):
            return "value_model"
        return None

    def train_mode(self) -> None:
        self.module.train()

    def eval_mode(self) -> None:
        self.module.eval()

    def _require_optimizer(self) -> tuple[torch.optim.Optimizer, LambdaLR]:
        if self.optimizer is None or self.lr_scheduler is None:
            raise NotInitializedError(
                f"rank {self.layout.rank}: this {self.strategy} engine was built without an "
                "optimizer (inference only)"
            )
        return self.optimizer, self.lr_scheduler

    def zero_grad(self) -> None:
        self._require_optimizer()[0].zero_grad(set_to_none=True)

    def clip_grad_norm(self, max_norm: float) -> float:
        """Scale the gradients to a global L2 norm of at most ``max_norm``; return the norm.

        The norm covers every parameter across the whole mesh: each rank sums the squares
        of its local shards, divided by the number of ranks holding a copy of that shard
        (within its pipeline stage), and one all-reduce adds the ranks up. Works for any
        mix of FSDP, HSDP and TP placements (:func:`._optim.clip_grad_norm`).
        """
        return clip_grad_norm(self.module.parameters(), max_norm, self.device, self.layout.pp_size)

    def optimizer_step(self, max_norm: float) -> float:
        """Clip, then step the optimizer (skipped, with a warning, if the norm is not finite)."""
        optimizer, _ = self._require_optimizer()
        norm = self.clip_grad_norm(max_norm)
        if math.isfinite(norm):
            optimizer.step()
        else:
            logger.warning(
                "rank %d: gradient norm is %s; skipping this optimizer step", self.layout.rank, norm
            )
        optimizer.zero_grad(set_to_none=True)
        return norm

    def lr_scheduler_step(self) -> float:
        """Advance the schedule one step; return the new learning rate."""
        _, scheduler = self._require_optimizer()
        scheduler.step()
        return self.get_lr()

    def get_lr(self) -> float:
        optimizer, _ = self._require_optimizer()
        return float(optimizer.param_groups[0]["lr"])

    # ---------------------------------------------------------------- offload
    def offload_params(self) -> None:
        """Move the (sharded) parameters to CPU; a no-op on a CPU device."""
        if self.device.type != "cpu" and self._params_on_device:
            self.module.to("cpu")
            self._params_on_device = False

    def load_params(self) -> None:
        if self.device.type != "cpu" and not self._params_on_device:
            self.module.to(self.device)
            self._params_on_device = True

    def _move_optimizer_state(self, device: torch.device | str) -> None:
        if self.optimizer is None:
            return
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, Tensor) and key != "step":
                    state[key] = value.to(device)

    def offload_optimizer(self) -> None:
        """Move the optimizer state to CPU; a no-op on a CPU device."""
        if self.device.type != "cpu" and self._optim_on_device:
            self._move_optimizer_state("cpu")
            self._optim_on_device = False

    def load_optimizer(self) -> None:
        if self.device.type != "cpu" and not self._optim_on_device:
            self._move_optimizer_state(self.device)
            self._optim_on_device = True

    @contextlib.contextmanager
    def on_device(self, with_optimizer: bool = False) -> Iterator[None]:
        """Bring offloaded state to the device for one stage, and offload it again after."""
        self.load_params()
        if with_optimizer:
            self.load_optimizer()
        try:
            yield
        finally:
            if self.fsdp_config.param_offload:
                self.offload_params()
            if with_optimizer and self.fsdp_config.optimizer_offload:
                self.offload_optimizer()

    # ------------------------------------------------------------- checkpoint
    def full_state_dict(self) -> dict[str, Tensor]:
        """Every parameter and buffer as a full CPU tensor, on rank 0 (empty elsewhere).

        A collective (torch.distributed.checkpoint's ``get_model_state_dict`` with
        ``full_state_dict``): every rank of the engine must call it.
        """
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.module, options=options)
        return {name: value for name, value in state.items() if isinstance(value, Tensor)}

    def local_state_dict(self, copy: bool = True) -> dict[str, Any]:
        """This rank's shards of the model, optimizer and schedule, as plain CPU tensors.

        ``model_chunks`` records, per parameter, the full shape and where this rank's block
        starts, so that an offline export can reassemble full tensors (and a checkpoint load
        into another layout); ``optim_param_names`` names the optimizer's parameters in the
        order that keys the optimizer state. With ``copy=False`` tensors already on the CPU
        are the live ones (views, no copy): the caller must be done with them before the next
        update changes them.
        """
        return local_state_dict(self.module, self.optimizer, self.lr_scheduler, copy)

    def kept_state(self) -> dict[str, Any]:
        """This rank's shards of the model, optimizer and schedule, as :meth:`local_state_dict`
        returns them, on the CPU, taken without any collective from the parameters as they were
        sharded at build time: what a worker keeps when a failed call tore the process groups
        down (a forward or backward that failed half way may have left unsharded parameters
        in the module), to load into the engine it rebuilds on new groups. Gradients are
        dropped; an update that failed before its optimizer step changed nothing."""
        return local_state_dict(
            self.module, self.optimizer, self.lr_scheduler, copy=False, params=self._sharded_params
        )

    def load_local_state_dict(self, state: dict[str, Any], source: str) -> None:
        """Restore what :meth:`local_state_dict` returned; names and shapes must match."""
        load_local_state_dict(
            self.module,
            self.optimizer,
            self.lr_scheduler,
            state,
            source,
            self.layout.rank,
            self.device,
        )
