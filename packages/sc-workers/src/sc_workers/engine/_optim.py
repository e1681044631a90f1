"""How an engine trains: AdamW with a warmup schedule, and gradient clipping by the global
norm over every placement of the mesh (FSDP, HSDP, TP, or a mix)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from .._config import OptimConfig

__all__ = ["clip_grad_norm", "make_optimizer", "warmup_lr_lambda"]


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


def make_optimizer(
    params: Iterable[Tensor], config: OptimConfig
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW over ``params`` and its :func:`warmup_lr_lambda` schedule."""
    optimizer = torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        weight_decay=config.weight_decay,
        foreach=False,
    )
    return optimizer, LambdaLR(optimizer, warmup_lr_lambda(config))


def clip_grad_norm(
    params: Iterable[Tensor], max_norm: float, device: torch.device, pp_size: int = 1
) -> float:
    """Scale the gradients to a global L2 norm of at most ``max_norm``; return the norm.

    The norm covers every parameter across the whole mesh: each rank sums the squares of
    its local shards, divided by the number of ranks holding a copy of that shard, and one
    all-reduce adds the ranks up. With ``pp_size`` pipeline stages a parameter lives on
    the ``world / pp_size`` ranks of its stage only. A collective: every rank of the
    default group calls it.
    """
    holders = dist.get_world_size() // pp_size
    total = torch.zeros((), dtype=torch.float64, device=device)
    grads: list[Tensor] = []
    for p in params:
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
        copies = holders / sharded
        total += local.detach().double().pow(2).sum().to(device) / copies
    dist.all_reduce(total)
    norm = float(total.sqrt().item())
    if math.isfinite(norm) and norm > max_norm:
        coef = max_norm / (norm + 1e-6)
        with torch.no_grad():
            for g in grads:
                g.mul_(coef)
    return norm
