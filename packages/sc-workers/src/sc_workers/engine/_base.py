"""The engine interface: a sharded model, its optimizer and schedule, and its layout."""

from __future__ import annotations

import contextlib
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from .._config import FSDPConfig, ModelConfig, OptimConfig
from .._errors import CheckpointError, NotInitializedError
from ..models import HFCausalLM, HFModelKind, HFValueModel, TinyCausalLM, load_hf_model
from ._parallel import ParallelLayout, init_distributed

__all__ = ["Engine", "block_modules", "chunk_of", "param_dtype_for", "warmup_lr_lambda"]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def param_dtype_for(setting: str, device: torch.device) -> torch.dtype:
    """The compute dtype for FSDP's mixed precision: "auto" is bf16 where CUDA supports it."""
    if setting == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return _DTYPES[setting]


def warmup_lr_lambda(config: OptimConfig) -> Callable[[int], float]:
    """Linear warmup to 1, then constant or cosine decay to ``min_lr_ratio``."""
    warmup = config.num_warmup_steps
    total = config.total_training_steps
    style = config.warmup_style
    floor = config.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if style == "constant":
            return 1.0
        progress = min(1.0, max(0.0, (step - warmup) / max(1, total - warmup)))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def block_modules(module: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks (each gets its own FSDP unit), outermost first.

    The built-in model's ``layers``; for a transformers model the modules whose class its
    ``_no_split_modules`` names (the decoder layers, e.g. every ``model.model.layers[i]``
    of a Llama), else the children of a ``ModuleList`` called ``layers``, ``h`` or
    ``blocks``.
    """
    if isinstance(module, TinyCausalLM):
        return list(module.layers)
    block_classes: set[str] = set()
    for child in module.modules():
        block_classes.update(getattr(child, "_no_split_modules", None) or ())
    blocks: list[nn.Module] = []
    taken: list[str] = []
    for name, child in module.named_modules():
        if any(name.startswith(prefix + ".") for prefix in taken):
            continue  # inside a block already found
        if type(child).__name__ in block_classes:
            blocks.append(child)
            taken.append(name)
    if blocks:
        return blocks
    for name, child in module.named_modules():
        if isinstance(child, nn.ModuleList) and name.rsplit(".", 1)[-1] in (
            "layers",
            "h",
            "blocks",
        ):
            blocks.extend(child)
    return blocks


def chunk_of(param: Tensor) -> tuple[list[int], list[int]]:
    """``(global_shape, offsets)``: where this rank's local block of ``param`` sits.

    A DTensor shard (FSDP, TP, or both) is one rectangular block of the full tensor; the
    checkpoint records it so that an offline export can reassemble full tensors.
    """
    if isinstance(param, DTensor):
        # the DCP planner's hook; torch leaves it unannotated
        chunks: list[Any] = param.__create_chunk_list__()  # type: ignore[no-untyped-call]
        if len(chunks) != 1:  # pragma: no cover - DTensor keeps one local block per rank
            raise CheckpointError(f"a DTensor with {len(chunks)} local chunks is not supported")
        return list(param.shape), [int(o) for o in chunks[0].offsets]
    return list(param.shape), [0] * param.dim()


def _local(t: Tensor) -> Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


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
        self._params_on_device = True
        self._optim_on_device = True

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
        cfg = self.model_config
        dtype = _DTYPES[cfg.dtype]
        if cfg.path is not None:
            return load_hf_model(cfg.path, self.value_head, dtype, seed=cfg.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            module = TinyCausalLM(cfg, value_head=self.value_head)
        return module.to(dtype)

    @abstractmethod
    def _make_mesh(self) -> DeviceMesh: ...

    @abstractmethod
    def _parallelize(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module: ...

    def build(self) -> None:
        """Join the process group, create and shard the model, and set up the optimizer."""
        if self._module is not None:
            return
        init_distributed(self.layout.world_size, self.layout.rank, self.device)
        mesh = self._make_mesh()
        self.device_mesh = mesh
        module = self._create_module().to(self.device)
        self._module = self._parallelize(module, mesh)
        if self.optim_config is not None:
            oc = self.optim_config
            self.optimizer = torch.optim.AdamW(
                self._module.parameters(),
                lr=oc.lr,
                betas=oc.betas,
                eps=oc.eps,
                weight_decay=oc.weight_decay,
                foreach=False,
            )
            self.lr_scheduler = LambdaLR(self.optimizer, warmup_lr_lambda(oc))
        logger.info(
            "rank %d: built %s engine (dp %d/%d, tp %d/%d) on %s",
            self.layout.rank,
            self.strategy,
            self.layout.dp_rank,
            self.layout.dp_size,
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
        """Logits ``[b, s, vocab]`` (or values ``[b, s]``) for the given tokens."""
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
        of its local shards, divided by the number of ranks holding a copy of that shard,
        and one all-reduce adds the ranks up. Works for any mix of FSDP, HSDP and TP
        placements.
        """
        world = dist.get_world_size()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        grads: list[Tensor] = []
        for p in self.module.parameters():
            if p.grad is None:
                continue
            g = p.grad
            grads.append(g)
            if isinstance(g, DTensor):
                sharded = 1
                for i, placement in enumerate(g.placements):
                    # any split placement (Shard, and FSDP's _StridedShard under TP)
                    if not (placement.is_replicate() or placement.is_partial()):
                        sharded *= g.device_mesh.size(i)
                local = g.to_local()
            else:
                sharded, local = 1, g
            copies = world / sharded
            total += local.detach().double().pow(2).sum().to(self.device) / copies
        dist.all_reduce(total)
        norm = float(total.sqrt().item())
        if math.isfinite(norm) and norm > max_norm:
            coef = max_norm / (norm + 1e-6)
            with torch.no_grad():
                for g in grads:
                    g.mul_(coef)
        return norm

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

    def local_state_dict(self) -> dict[str, Any]:
        """This rank's shards of the model, optimizer and schedule, as plain CPU tensors.

        ``model_chunks`` records, per parameter, the full shape and where this rank's block
        starts (see :func:`chunk_of`).
        """
        params = dict(self.module.named_parameters())
        model = {name: _local(p.detach()).cpu().clone() for name, p in params.items()}
        chunks = {name: chunk_of(p) for name, p in params.items()}
        state: dict[str, Any] = {"model": model, "model_chunks": chunks}
        if self.optimizer is not None and self.lr_scheduler is not None:
            optim = self.optimizer.state_dict()
            optim["state"] = {
                idx: {
                    k: (_local(v).cpu().clone() if isinstance(v, Tensor) else v)
                    for k, v in entry.items()
                }
                for idx, entry in optim["state"].items()
            }
            state["optim"] = optim
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        return state

    def load_local_state_dict(self, state: dict[str, Any], source: str) -> None:
        """Restore what :meth:`local_state_dict` returned; names and shapes must match."""
        rank = self.layout.rank
        params = dict(self.module.named_parameters())
        saved: dict[str, Tensor] = state["model"]
        if set(saved) != set(params):
            missing = sorted(set(params) - set(saved))
            extra = sorted(set(saved) - set(params))
            raise CheckpointError(
                f"rank {rank}: checkpoint {source} does not match the model: missing "
                f"{missing[:5]}, unexpected {extra[:5]}"
            )
        with torch.no_grad():
            for name, p in params.items():
                local = _local(p)
                if tuple(local.shape) != tuple(saved[name].shape):
                    raise CheckpointError(
                        f"rank {rank}: checkpoint {source}: {name} has local shape "
                        f"{tuple(saved[name].shape)}, the model has {tuple(local.shape)}"
                    )
                local.copy_(saved[name])
        if self.optimizer is None or self.lr_scheduler is None:
            return
        if "optim" not in state:
            raise CheckpointError(f"rank {rank}: checkpoint {source} has no optimizer state")
        optim = dict(state["optim"])
        ordered = [p for group in self.optimizer.param_groups for p in group["params"]]
        restored: dict[int, dict[str, Any]] = {}
        for idx, entry in optim["state"].items():
            param = ordered[int(idx)]
            new_entry: dict[str, Any] = {}
            for key, value in entry.items():
                if isinstance(value, Tensor) and isinstance(param, DTensor) and key != "step":
                    value = DTensor.from_local(
                        value.to(self.device),
                        param.device_mesh,
                        param.placements,
                        run_check=False,
                        shape=param.shape,
                        stride=param.stride(),
                    )
                new_entry[key] = value
            restored[int(idx)] = new_entry
        optim["state"] = restored
        self.optimizer.load_state_dict(optim)
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
