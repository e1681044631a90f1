"""One ``generate_sequences`` call, shared by the hybrid actor and the rollout worker: the
sampling settings from the config and ``meta_info``, sampling, and the output batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from sc_protocol import DataProto

from .._config import ModelConfig, RolloutConfig
from .._errors import BatchError
from ..engine import Engine
from ._ppo import gather_tensors
from ._rollout_format import rollout_tensors
from ._sampling import BatchSampling, eos_tuple, generate

__all__ = ["generate_batch", "meta_float", "sampling_params"]


def meta_float(meta: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise BatchError(f"{where}: meta_info[{key!r}] must be a number, got {value!r}")
    return float(value)


def sampling_params(
    meta: Mapping[str, Any], rc: RolloutConfig, mc: ModelConfig, where: str
) -> BatchSampling:
    """The rollout config's sampling settings, overridden by ``meta_info``."""
    length = meta.get("response_length", meta.get("max_new_tokens", rc.response_length))
    temperature = meta_float(meta, "temperature", rc.temperature, where)
    top_p = meta_float(meta, "top_p", rc.top_p, where)
    top_k = int(meta.get("top_k", rc.top_k))
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise BatchError(f"{where}: response_length must be a positive int, got {length!r}")
    if temperature <= 0:
        raise BatchError(f"{where}: temperature must be > 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise BatchError(f"{where}: top_p must be in (0, 1], got {top_p}")
    eos = meta.get("eos_token_id", mc.eos_token_id)
    pad = meta.get("pad_token_id", mc.pad_token_id)
    return BatchSampling(
        response_length=length,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        do_sample=bool(meta.get("do_sample", rc.do_sample)),
        eos_token_ids=eos_tuple(eos),
        pad_token_id=int(pad),
        exact_window=rc.exact_window,
    )


def generate_batch(
    engine: Engine,
    generator: torch.Generator,
    prompts: DataProto,
    params: BatchSampling,
    where: str,
) -> DataProto:
    """Sample responses for ``prompts`` and build the output batch (see
    ``ActorRolloutRefWorker.generate_sequences``)."""
    t = gather_tensors(prompts, ("input_ids", "attention_mask", "position_ids"), (), where)
    with engine.on_device():
        engine.eval_mode()
        responses, response_mask, log_probs = generate(
            engine,
            t["input_ids"],
            t["attention_mask"],
            t["position_ids"],
            params,
            generator,
        )
    out = rollout_tensors(
        t["input_ids"],
        t["attention_mask"],
        t["position_ids"],
        responses.cpu(),
        response_mask.cpu(),
        log_probs.cpu(),  # the behaviour policy's: the importance ratio of off-policy PPO
    )
    return DataProto.from_dict(tensors=out, non_tensors=dict(prompts.non_tensor_batch))
