"""Worker configurations from a local Hugging Face model directory (extra ``sc-workers[hf]``)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Literal

from ._config import ActorRolloutRefConfig, CriticConfig, ModelConfig
from ._errors import ConfigError
from .models._hf import (
    check_hf_tensor_parallel,
    hf_text_config,
    import_transformers,
    load_hf_tokenizer,
)
from .models._hf_ulysses import check_hf_sequence_parallel

__all__ = ["hf_model_config", "hf_worker_configs"]

logger = logging.getLogger(__name__)

_ModelDtype = Literal["float32", "bfloat16", "float16"]


def _token_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    return [int(v) for v in value]


def _read(path: str) -> tuple[Any, Any]:
    """The transformers config and the generation config (None without one) of ``path``."""
    transformers = import_transformers(f"model.path {path!r}")
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(
            f"model.path {path!r} is not a local Hugging Face model directory (no config.json)"
        )
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    generation = None
    if (Path(path) / "generation_config.json").is_file():
        generation = transformers.GenerationConfig.from_pretrained(path, local_files_only=True)
    return config, generation


def hf_model_config(
    path: str,
    *,
    dtype: _ModelDtype = "float32",
    seed: int = 0,
    pad_token_id: int | None = None,
    eos_token_id: int | tuple[int, ...] | None = None,
) -> ModelConfig:
    """A :class:`ModelConfig` for the Hugging Face model directory ``path``.

    The architecture fields mirror the directory's ``config.json`` (informational: the
    engines build the model from the directory itself). The end-of-sequence ids are the
    generation config's (all of them, when it lists several) plus the tokenizer's; the
    padding id is the tokenizer's (its eos when it has none, see
    :func:`~sc_workers.load_hf_tokenizer`), else the config's, else the first eos.
    ``pad_token_id`` / ``eos_token_id`` override them. ``dtype`` is the dtype the
    parameters are kept in (float32 by default: FSDP computes in
    ``fsdp_config.param_dtype``), ``seed`` initialises the critic's value head.
    """
    config, generation = _read(path)
    text = hf_text_config(config)
    tokenizer = None
    try:
        tokenizer = load_hf_tokenizer(path)
    except (OSError, ValueError) as exc:
        logger.warning("no tokenizer loaded from %s (%s); token ids from the config", path, exc)
    eos: list[int] = []
    sources = [
        getattr(generation, "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
        getattr(text, "eos_token_id", None),
    ]
    for source in sources:
        eos += [i for i in _token_ids(source) if i not in eos]
    if eos_token_id is not None:
        eos = _token_ids(eos_token_id)
    if not eos:
        raise ConfigError(
            f"model.path {path!r}: neither the generation config, the tokenizer nor the "
            "config names an eos token; pass eos_token_id"
        )
    pad = pad_token_id
    for candidate in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(generation, "pad_token_id", None),
        getattr(text, "pad_token_id", None),
    ):
        if pad is None and isinstance(candidate, int):
            pad = candidate
    if pad is None:
        pad = eos[0]
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    rope = getattr(text, "rope_parameters", None) or {}
    rope_theta = getattr(text, "rope_theta", None) or rope.get("rope_theta") or 10000.0
    eps = getattr(text, "rms_norm_eps", None) or getattr(text, "layer_norm_eps", None) or 1e-6
    return ModelConfig(
        path=path,
        vocab_size=int(text.vocab_size),
        hidden_size=hidden,
        num_hidden_layers=int(text.num_hidden_layers),
        num_attention_heads=heads,
        intermediate_size=int(getattr(text, "intermediate_size", None) or 4 * hidden),
        max_position_embeddings=int(getattr(text, "max_position_embeddings", None) or 2048),
        rope_theta=float(rope_theta),
        rms_norm_eps=float(eps),
        tie_word_embeddings=bool(
            getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False))
        ),
        pad_token_id=int(pad),
        eos_token_id=eos[0] if len(eos) == 1 else tuple(eos),
        seed=seed,
        dtype=dtype,
    )


def hf_worker_configs(
    path: str,
    actor_rollout_ref: ActorRolloutRefConfig | None = None,
    critic: CriticConfig | None = None,
    *,
    dtype: _ModelDtype = "float32",
    seed: int = 0,
) -> tuple[ActorRolloutRefConfig, CriticConfig]:
    """The actor/rollout/reference and critic configurations for the model at ``path``.

    ``actor_rollout_ref`` and ``critic`` (defaults when omitted) keep every setting but
    their ``model``, which becomes :func:`hf_model_config` ``(path, dtype=dtype,
    seed=seed)``. With the megatron strategy, the model's head counts and MLP width must
    divide by the tensor-parallel size, and with Ulysses sequence parallelism its attention
    heads by ``ulysses_sequence_parallel_size`` (:class:`ConfigError` otherwise).
    """
    model = hf_model_config(path, dtype=dtype, seed=seed)
    actor_cfg = dataclasses.replace(actor_rollout_ref or ActorRolloutRefConfig(), model=model)
    critic_cfg = dataclasses.replace(critic or CriticConfig(), model=model)
    config, _ = _read(path)
    sections: list[tuple[str, str, int]] = [
        ("actor", actor_cfg.actor.strategy, actor_cfg.actor.megatron.tensor_model_parallel_size),
        ("ref", actor_cfg.ref.strategy, actor_cfg.ref.megatron.tensor_model_parallel_size),
        ("critic", critic_cfg.strategy, critic_cfg.megatron.tensor_model_parallel_size),
    ]
    for owner, strategy, tp in sections:
        if strategy == "megatron":
            check_hf_tensor_parallel(config, tp, f"{owner}: model {path!r}")
    sp_sizes = {
        "actor": actor_cfg.actor.ulysses_sequence_parallel_size,
        "ref": actor_cfg.ref.ulysses_sequence_parallel_size,
        "critic": critic_cfg.ulysses_sequence_parallel_size,
    }
    for owner, sp in sp_sizes.items():
        check_hf_sequence_parallel(config, sp, f"{owner}: model {path!r}")
    return actor_cfg, critic_cfg
