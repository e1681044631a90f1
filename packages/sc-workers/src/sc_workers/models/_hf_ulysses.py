"""Ulysses sequence parallelism for transformers decoder models.

transformers' attention classes call an attention function looked up by name in its
registry (``AttentionInterface``) with ``[b, heads, s, d]`` queries, keys and values, and
pass the model's extra keyword arguments through to it. :func:`enable_hf_sequence_parallel`
registers :data:`~._ulysses.ULYSSES_ATTENTION` (SDPA between the two Ulysses all-to-alls)
and makes the model use it. A sequence-sharded forward passes its
:class:`~._ulysses.SequenceParallel` as the keyword :data:`~._ulysses.SP_KWARG` and the
full 4-D mask (see :class:`~._hf.HFCausalLM`); any other forward (generation with a
key/value cache) runs transformers' own SDPA function unchanged.

Architectures whose attention does not go through the registry (``_supports_attention_backend``
false: Bloom, MPT, Falcon, ...) or that use sliding-window / chunked layers raise
:class:`UnsupportedParallelismError`.
"""

from __future__ import annotations

import importlib
import logging
from types import SimpleNamespace
from typing import Any

from torch import Tensor

from .._errors import BatchError, ConfigError, UnsupportedParallelismError
from ._hf import HFCausalLM, HFValueModel, hf_text_config, import_transformers
from ._ulysses import SP_KWARG, ULYSSES_ATTENTION, SequenceParallel

__all__ = ["check_hf_sequence_parallel", "enable_hf_sequence_parallel", "ulysses_attention"]

logger = logging.getLogger(__name__)

#: attention arguments whose meaning the plain causal SDPA below does not implement
_UNSUPPORTED_ARGS = ("sliding_window", "softcap", "s_aux", "sinks", "position_bias")


def _sdpa_attention() -> Any:
    module = importlib.import_module("transformers.integrations.sdpa_attention")
    return module.sdpa_attention_forward


def ulysses_attention(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' SDPA attention, between the Ulysses all-to-alls when the forward
    carries a :class:`SequenceParallel` (keyword :data:`SP_KWARG`).

    ``query`` is this rank's shard ``[b, heads, s/sp, d]`` (keys and values likewise, with
    their own head count); ``attention_mask`` the full ``[b, 1, s, s]`` mask. Key/value
    heads that do not divide by the sp size are repeated to the query head count first.
    Returns ``[b, s/sp, heads, d]``, what transformers' attention functions return.
    """
    sdpa = _sdpa_attention()
    sp = kwargs.pop(SP_KWARG, None)
    if sp is None:
        out: tuple[Tensor, None] = sdpa(module, query, key, value, attention_mask, **kwargs)
        return out
    where = f"Ulysses attention in {type(module).__name__}"
    if not isinstance(sp, SequenceParallel):
        raise BatchError(f"{where}: {SP_KWARG} must be a SequenceParallel, got {type(sp).__name__}")
    for name in _UNSUPPORTED_ARGS:
        if kwargs.get(name) is not None:
            raise UnsupportedParallelismError(
                f"{where} (sp rank {sp.rank}): the layer passes {name}={kwargs[name]!r}; "
                "ulysses_sequence_parallel_size > 1 covers plain causal attention only"
            )
    heads, kv_heads = query.shape[1], key.shape[1]
    target: Any = module
    if kv_heads % sp.size:
        groups = heads // kv_heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
        target = SimpleNamespace(num_key_value_groups=1, is_causal=True)
    q, k, v = sp.seq_to_heads(query), sp.seq_to_heads(key), sp.seq_to_heads(value)
    attn, _ = sdpa(target, q, k, v, attention_mask, **kwargs)  # [b, s, heads/sp, d]
    return sp.heads_to_seq(attn, head_dim=2, seq_dim=1), None


def _register(transformers: Any) -> None:
    """Register :func:`ulysses_attention` and its mask function (transformers' SDPA mask,
    used by the forwards that are not sequence-sharded) under :data:`ULYSSES_ATTENTION`."""
    masking = importlib.import_module("transformers.masking_utils")
    transformers.AttentionInterface.register(ULYSSES_ATTENTION, ulysses_attention)
    masking.AttentionMaskInterface.register(ULYSSES_ATTENTION, masking.sdpa_mask)


def check_hf_sequence_parallel(config: Any, sp: int, where: str) -> None:
    """The attention heads of a transformers config divide by ``sp`` (:class:`ConfigError`
    otherwise), and every layer has full causal attention (no sliding-window or chunked
    layers: :class:`UnsupportedParallelismError`)."""
    if sp == 1:
        return
    text = hf_text_config(config)
    model_type = getattr(text, "model_type", "?")
    heads = getattr(text, "num_attention_heads", None)
    if not isinstance(heads, int) or isinstance(heads, bool):
        raise UnsupportedParallelismError(
            f"{where}: the {model_type} config has no integer num_attention_heads (got "
            f"{heads!r}); ulysses_sequence_parallel_size {sp} splits attention heads"
        )
    if heads % sp:
        raise ConfigError(
            f"{where}: num_attention_heads {heads} is not divisible by "
            f"ulysses_sequence_parallel_size {sp}"
        )
    layer_types = getattr(text, "layer_types", None)
    if layer_types:
        other = sorted({str(t) for t in layer_types if t != "full_attention"})
    else:  # no per-layer types: a sliding window applies to every layer (Mistral)
        window = getattr(text, "sliding_window", None)
        other = [] if window is None else [f"sliding_attention (window {window})"]
    if getattr(text, "use_sliding_window", False) and not other:
        other = ["sliding_attention"]
    if other:
        raise UnsupportedParallelismError(
            f"{where}: the {model_type} model has {other} layers; "
            f"ulysses_sequence_parallel_size {sp} covers full causal attention only"
        )


def enable_hf_sequence_parallel(module: HFCausalLM | HFValueModel, sp: int, where: str) -> None:
    """Check that ``module`` can run sequence-sharded over ``sp`` ranks and switch its
    attention to :data:`ULYSSES_ATTENTION` (in place)."""
    model: Any = module.model
    config = module.hf_config
    model_type = getattr(hf_text_config(config), "model_type", "?")
    if not getattr(type(model), "_supports_attention_backend", False):
        raise UnsupportedParallelismError(
            f"{where}: {type(model).__name__} ({model_type}) does not call its attention "
            "through transformers' AttentionInterface, which ulysses_sequence_parallel_size "
            f"{sp} needs (Llama, Qwen2 and similar decoder models do)"
        )
    check_hf_sequence_parallel(config, sp, where)
    _register(import_transformers("Ulysses sequence parallelism"))
    model.set_attn_implementation(ULYSSES_ATTENTION)
    if getattr(model.config, "_attn_implementation", None) != ULYSSES_ATTENTION:
        raise UnsupportedParallelismError(
            f"{where}: {type(model).__name__} ({model_type}) did not take the attention "
            f"implementation {ULYSSES_ATTENTION!r}"
        )
    logger.info("%s: %s runs Ulysses attention over %d ranks", where, type(model).__name__, sp)
