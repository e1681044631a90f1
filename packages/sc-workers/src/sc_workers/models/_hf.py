"""Optional: a local Hugging Face model behind the built-in model's interface.

``transformers`` is imported only when :func:`load_hf_model` runs (extra
``sc-workers[hf]``). Only local directories are read (``local_files_only=True``).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import torch
from torch import Tensor, nn

from .._errors import ConfigError, OptionalDependencyError

__all__ = ["HFCausalLM", "load_hf_model"]

logger = logging.getLogger(__name__)


class HFCausalLM(nn.Module):
    """Wraps a ``transformers`` model: ``forward(input_ids, attention_mask, position_ids)``.

    Returns logits ``[batch, seq, vocab]``, or values ``[batch, seq]`` for a token
    classification model with one label (the critic). Generation recomputes the whole
    sequence at each step (no key/value cache through this adapter).
    """

    supports_kv_cache = False

    def __init__(self, model: nn.Module, value_head: bool) -> None:
        super().__init__()
        self.model = model
        self.value_head = value_head

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: Any = None,
    ) -> Tensor:
        if cache is not None:
            raise ConfigError("HFCausalLM does not support a key/value cache")
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        logits: Tensor = out.logits
        if self.value_head:
            return logits[..., 0]
        return logits


def load_hf_model(path: str, value_head: bool, dtype: torch.dtype) -> HFCausalLM:
    """Load a causal LM (or, with ``value_head``, a one-label token classifier) from ``path``."""
    try:
        transformers = importlib.import_module("transformers")
    except ImportError as exc:
        raise OptionalDependencyError(
            f"model.path {path!r} needs transformers: install sc-workers[hf]"
        ) from exc
    if value_head:
        model = transformers.AutoModelForTokenClassification.from_pretrained(
            path, num_labels=1, local_files_only=True
        )
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    model = model.to(dtype)
    logger.info("loaded Hugging Face model %s from %s", type(model).__name__, path)
    return HFCausalLM(model, value_head)
