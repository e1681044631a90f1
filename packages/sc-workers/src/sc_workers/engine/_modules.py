"""What an engine shards: the model it creates (the built-in transformer or a local Hugging
Face model), its repeated blocks (each an FSDP unit / a tensor-parallel decoder layer), and
the dtypes it computes in."""

from __future__ import annotations

import torch
from torch import nn

from .._config import ModelConfig
from ..models import ModelStage, TinyCausalLM, load_hf_model

__all__ = ["DTYPES", "block_modules", "create_module", "param_dtype_for"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def param_dtype_for(setting: str, device: torch.device) -> torch.dtype:
    """The compute dtype for FSDP's mixed precision: "auto" is bf16 where CUDA supports it."""
    if setting == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return DTYPES[setting]


def create_module(config: ModelConfig, value_head: bool) -> nn.Module:
    """The unsharded model of ``config``, on the CPU, initialised from ``config.seed``
    identically on every rank (without touching the global random state)."""
    dtype = DTYPES[config.dtype]
    if config.path is not None:
        return load_hf_model(config.path, value_head, dtype, seed=config.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        module = TinyCausalLM(config, value_head=value_head)
    return module.to(dtype)


def block_modules(module: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks (each gets its own FSDP unit), outermost first.

    The built-in model's ``layers``, a pipeline stage's own (:meth:`ModelStage.blocks`);
    for a transformers model the modules whose class its
    ``_no_split_modules`` names (the decoder layers, e.g. every ``model.model.layers[i]``
    of a Llama), else the children of a ``ModuleList`` called ``layers``, ``h`` or
    ``blocks``.
    """
    if isinstance(module, TinyCausalLM):
        return list(module.layers)
    if isinstance(module, ModelStage):
        return module.blocks()
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
