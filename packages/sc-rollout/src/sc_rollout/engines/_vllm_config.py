"""``VLLMEngineConfig``: what a vLLM engine serves and how, and the command line of its
server process (the vLLM environment's interpreter running ``python -m sc_rollout vllm``).
Importable without vLLM: the trainer's side builds the command, the server's side the
engine."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import RolloutConfigError, RolloutTypeError
from ._types import check_int

__all__ = ["VLLMEngineConfig", "model_facts", "vllm_argv", "vllm_env_vars"]

_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class VLLMEngineConfig:
    """A vLLM engine over the local Hugging Face model directory ``model``.

    ``max_model_len``: the context (prompt and completion) in tokens; ``None``: the model's
    own (``max_position_embeddings`` or ``n_positions``). ``seed`` seeds the engine's
    sampling (a request's own ``seed`` wins). ``dtype`` of the weights and compute: the CPU
    build runs float32 (and bfloat16). ``kv_cache_gb``: the key/value cache on the CPU build
    (``VLLM_CPU_KVCACHE_SPACE``, whole GiB); ``gpu_memory_utilization`` its share of a GPU.
    ``max_num_seqs``: the most requests batched in one step. ``name`` is the model's name in
    answers and health (default: the directory's name).
    """

    model: str
    max_model_len: int | None = None
    seed: int = 0
    dtype: str = "float32"
    kv_cache_gb: int = 1
    gpu_memory_utilization: float = 0.5
    max_num_seqs: int = 64
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)):
            raise RolloutTypeError(f"VLLMEngineConfig.model must be a path, got {self.model!r}")
        model = os.fspath(self.model)
        if not isinstance(model, str) or not (Path(model) / "config.json").is_file():
            raise RolloutConfigError(
                f"VLLMEngineConfig.model {model!r} is not a local Hugging Face model directory "
                "(no config.json); nothing is downloaded"
            )
        object.__setattr__(self, "model", str(Path(model).resolve()))
        if self.max_model_len is not None:
            check_int(self.max_model_len, "VLLMEngineConfig.max_model_len", 1, RolloutConfigError)
        check_int(self.seed, "VLLMEngineConfig.seed", 0, RolloutConfigError)
        if self.dtype not in _DTYPES:
            raise RolloutConfigError(
                f"VLLMEngineConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}"
            )
        check_int(self.kv_cache_gb, "VLLMEngineConfig.kv_cache_gb", 1, RolloutConfigError)
        share = self.gpu_memory_utilization
        if (
            isinstance(share, bool)
            or not isinstance(share, (int, float))
            or not (math.isfinite(share) and 0 < share <= 1)
        ):
            raise RolloutConfigError(
                f"VLLMEngineConfig.gpu_memory_utilization must be in (0, 1], got {share!r}"
            )
        check_int(self.max_num_seqs, "VLLMEngineConfig.max_num_seqs", 1, RolloutConfigError)
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise RolloutConfigError(
                f"VLLMEngineConfig.name must be a non-empty str or None, got {self.name!r}"
            )

    @property
    def served_name(self) -> str:
        return self.name or Path(self.model).name


def model_facts(model: str) -> dict[str, Any]:
    """The model's ``config.json`` (its text part, for a multimodal config)."""
    raw = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise RolloutConfigError(f"{model}/config.json is not a JSON object")
    text = raw.get("text_config")
    return {**raw, **text} if isinstance(text, dict) else raw


def vllm_argv(config: VLLMEngineConfig, python: str, host: str, port: int) -> list[str]:
    """The command line of a vLLM server process run by the vLLM environment's ``python``,
    isolated (``-I``) from the caller's ``PYTHONPATH`` and user site: the training
    environment's packages (its torch) must not be seen there."""
    argv = [python, "-I", "-m", "sc_rollout", "vllm", "--model", config.model]
    argv += ["--host", host, "--port", str(port), "--seed", str(config.seed)]
    argv += ["--dtype", config.dtype, "--kv-cache-gb", str(config.kv_cache_gb)]
    argv += ["--gpu-memory-utilization", repr(float(config.gpu_memory_utilization))]
    argv += ["--max-num-seqs", str(config.max_num_seqs), "--name", config.served_name]
    if config.max_model_len is not None:
        argv += ["--max-model-len", str(config.max_model_len)]
    return argv


def vllm_env_vars(config: VLLMEngineConfig, base: Mapping[str, str]) -> dict[str, str]:
    """The server process's environment: ``base`` without the training environment's
    Python paths, with vLLM's CPU settings (the KV cache size; threads not pinned to cores,
    on a machine others share) unless ``base`` sets them."""
    env = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_gb)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env
