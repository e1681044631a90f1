"""An engine's checkpoint state: this rank's shards of the model, optimizer and schedule as
plain CPU tensors, with where each shard sits in the full tensor, and the way back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from .._errors import CheckpointError

__all__ = [
    "chunk_of",
    "load_local_state_dict",
    "local_state_dict",
    "local_tensor",
    "optimizer_param_names",
]


def chunk_of(param: Tensor) -> tuple[list[int], list[int]]:
    """``(global_shape, offsets)``: where this rank's local block of ``param`` sits.

    A DTensor shard (FSDP, TP, or both) is one rectangular block of the full tensor; the
    checkpoint records it so that an offline export can reassemble full tensors.
    """
    if isinstance(param, DTensor):
        # the DCP planner's hook; torch leaves it unannotated
        chunks: list[Any] = param.__create_chunk_list__()  # type: ignore[no-untyped-call]  # a DTensor method without annotations
        if len(chunks) != 1:  # pragma: no cover - DTensor keeps one local block per rank
            raise CheckpointError(f"a DTensor with {len(chunks)} local chunks is not supported")
        return list(param.shape), [int(o) for o in chunks[0].offsets]
    return list(param.shape), [0] * param.dim()


def local_tensor(t: Tensor) -> Tensor:
    """This rank's block of ``t`` (a DTensor's local tensor; a plain tensor is whole)."""
    return t.to_local() if isinstance(t, DTensor) else t


def optimizer_param_names(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    params: Mapping[str, Tensor] | None = None,
) -> list[str]:
    """The names of ``optimizer``'s parameters in its order (the order that keys its
    state_dict): what lets a checkpoint's optimizer state load into another layout.
    ``params``: the module's parameters by name (default: ``module.named_parameters()``)."""
    named = module.named_parameters() if params is None else params.items()
    names = {id(p): name for name, p in named}
    ordered: list[str] = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names.get(id(p))
            if name is None:
                raise CheckpointError(
                    f"the optimizer holds a parameter of shape {tuple(p.shape)} that is not one "
                    "of the module's named parameters"
                )
            ordered.append(name)
    return ordered


def local_state_dict(
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: LambdaLR | None,
    copy: bool = True,
    params: Mapping[str, Tensor] | None = None,
) -> dict[str, Any]:
    """See :meth:`sc_workers.Engine.local_state_dict`; ``optim_param_names`` names the
    optimizer's parameters in the order that keys ``optim["state"]``. ``params``: the
    parameters by name (default: ``module.named_parameters()``)."""

    def cpu(t: Tensor) -> Tensor:
        return t.to("cpu", copy=copy)

    params = dict(module.named_parameters()) if params is None else dict(params)
    model = {name: cpu(local_tensor(p.detach())) for name, p in params.items()}
    chunks = {name: chunk_of(p) for name, p in params.items()}
    state: dict[str, Any] = {"model": model, "model_chunks": chunks}
    if optimizer is not None and scheduler is not None:
        optim = optimizer.state_dict()
        optim["state"] = {
            idx: {
                k: (cpu(local_tensor(v)) if isinstance(v, Tensor) else v) for k, v in entry.items()
            }
            for idx, entry in optim["state"].items()
        }
        state["optim"] = optim
        state["optim_param_names"] = optimizer_param_names(module, optimizer, params)
        state["lr_scheduler"] = scheduler.state_dict()
    return state


def load_local_state_dict(
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: LambdaLR | None,
    state: dict[str, Any],
    source: str,
    rank: int,
    device: torch.device,
) -> None:
    """See :meth:`sc_workers.Engine.load_local_state_dict`."""
    params = dict(module.named_parameters())
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
            local = local_tensor(p)
            if tuple(local.shape) != tuple(saved[name].shape):
                raise CheckpointError(
                    f"rank {rank}: checkpoint {source}: {name} has local shape "
                    f"{tuple(saved[name].shape)}, the model has {tuple(local.shape)}"
                )
            local.copy_(saved[name])
    if optimizer is None or scheduler is None:
        return
    if "optim" not in state:
        raise CheckpointError(f"rank {rank}: checkpoint {source} has no optimizer state")
    optim = dict(state["optim"])
    ordered = [p for group in optimizer.param_groups for p in group["params"]]
    restored: dict[int, dict[str, Any]] = {}
    for idx, entry in optim["state"].items():
        param = ordered[int(idx)]
        new_entry: dict[str, Any] = {}
        for key, value in entry.items():
            if isinstance(value, Tensor) and isinstance(param, DTensor) and key != "step":
                value = DTensor.from_local(
                    value.to(device),
                    param.device_mesh,
                    param.placements,
                    run_check=False,
                    shape=param.shape,
                    stride=param.stride(),
                )
            new_entry[key] = value
        restored[int(idx)] = new_entry
    optim["state"] = restored
    optimizer.load_state_dict(optim)
    scheduler.load_state_dict(state["lr_scheduler"])
