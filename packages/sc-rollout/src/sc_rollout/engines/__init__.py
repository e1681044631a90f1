"""The rollout-engine contract and the engines behind it.

* :class:`RolloutEngine`, the contract every engine, server client and router keeps:
  generate from token ids with :class:`SamplingParams` (:class:`GenerateRequest` in,
  :class:`GenerateResult` out: token ids, their log-probs, a :data:`FinishReason` of
  :data:`FINISH_REASONS` and the weight version they ran under), abort, pause and resume,
  load weights at a version (:class:`WeightUpdate`), health (:class:`EngineHealth`), sleep
  and wake up.
* vLLM: :class:`VLLMEngineConfig` and ``ServerProcess.vllm(config)`` run a vLLM engine's
  server with the interpreter of the vLLM environment (:class:`VLLMEnv`), which
  :func:`create_vllm_env` (``python -m sc_rollout vllm-env create``) makes from the pinned
  requirement files shipped here and :func:`find_vllm_env` finds; :func:`vllm_argv` and
  :func:`vllm_env_vars` are the command line and environment of its server. vLLM is never
  imported in the caller's environment.

The test and reference engine, ``ToyEngine``, is in :mod:`sc_rollout.testing`.
"""

from __future__ import annotations

from sc_dispatch import _public

from ._engine import RolloutEngine
from ._types import (
    FINISH_REASONS,
    EngineHealth,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightUpdate,
)
from ._vllm_config import VLLMEngineConfig, vllm_argv, vllm_env_vars
from ._vllm_env import VLLMEnv, create_vllm_env, find_vllm_env

__all__ = [
    "EngineHealth",
    "FINISH_REASONS",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "RolloutEngine",
    "SamplingParams",
    "VLLMEngineConfig",
    "VLLMEnv",
    "WeightUpdate",
    "create_vllm_env",
    "find_vllm_env",
    "vllm_argv",
    "vllm_env_vars",
]

_public.publish(globals())
