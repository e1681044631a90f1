"""sc-rollout: rollout engines behind an HTTP server, and a router over the servers.

* The rollout-engine contract, :class:`RolloutEngine`: generate from token ids with
  :class:`SamplingParams` (:class:`GenerateRequest` in, :class:`GenerateResult` out: token
  ids, their log-probs and the weight version they ran under), abort, pause and resume,
  load weights at a version (:class:`WeightUpdate`), health (:class:`EngineHealth`), sleep
  and wake up.
* :class:`RolloutServer` puts any engine behind an OpenAI-compatible token-in-token-out
  endpoint (``POST /v1/completions`` with ``prompt`` a list of token ids) plus control
  endpoints; :class:`ServerProcess` runs one in a process of its own (``python -m
  sc_rollout``); :class:`RolloutClient` is a server seen as an engine.
* :class:`Router` spreads requests over servers: sticky by session, least in flight
  otherwise, servers added and drained at runtime, dead ones retried elsewhere, restarted
  through the owner's hook and re-synced to the current weights.
* :class:`AgentSession`: one agent's multi-turn rollout at the token level, on any engine
  or router: model turns (:class:`Turn`) and appended tool tokens (:class:`AppendedTokens`),
  with the response mask and log-probs a trainer needs; never re-tokenized.
* :class:`AgentLoop`: many agent sessions at once (an ``async`` agent function per
  :class:`AgentTask`), bounded, each with a deadline; every session ends in one
  :class:`AgentOutcome` (done with its reward, or dropped with the reason), and groups are
  taken as they finish, so a batch need not wait for the slowest agents.
* :class:`ChatFront` and :class:`ChatServer`: an OpenAI-compatible chat-completions front
  (tool calls in the request and the answer) that records each conversation as an
  :class:`AgentSession`, applying the chat template (:class:`ChatTemplate`,
  :class:`HFChatTemplate`) once per turn to the new messages only; tool calls are read by a
  :class:`ToolCallParser` (:class:`HermesToolCallParser` by default) into :class:`ToolCall`.
* :class:`ToyEngine`: the test and reference engine, a seeded sampler over a tiny
  vocabulary with an optional delay per token. Not a model.

* vLLM: :class:`VLLMEngineConfig` and ``ServerProcess.vllm(config)`` run a vLLM engine's
  server with the interpreter of the vLLM environment, which :func:`create_vllm_env`
  (``python -m sc_rollout vllm-env create``) makes from the pinned requirement files
  shipped here; vLLM is never imported in the caller's environment.

Depends on sc-dispatch only (no torch, no Ray, no vLLM).
"""

from __future__ import annotations

from sc_dispatch import _public

from ._agent_loop import (
    AGENT_STATUSES,
    AgentFn,
    AgentLoop,
    AgentLoopConfig,
    AgentOutcome,
    AgentStatus,
    AgentTask,
    RewardFn,
)
from ._chat import ChatTemplate, HermesToolCallParser, HFChatTemplate, ToolCall, ToolCallParser
from ._chat_front import ChatFront
from ._chat_server import ChatServer
from ._cli import serve
from ._client import RolloutClient
from ._engine import RolloutEngine
from ._errors import (
    AgentLoopClosedError,
    ChatHistoryError,
    ChatTemplateError,
    DuplicateServerError,
    EngineNotInstalledError,
    EngineStateError,
    NoLiveServerError,
    PromptTooLongError,
    RolloutConfigError,
    RolloutRequestError,
    RolloutServerError,
    RolloutTimeoutError,
    RolloutTypeError,
    RouterClosedError,
    ScRolloutError,
    ServerUnavailableError,
    SessionStateError,
    UnknownServerError,
    UnknownSessionError,
    UnservableModelError,
    WeightLoadError,
    WeightMismatchError,
    WeightVersionError,
)
from ._process import ServerProcess
from ._router import Router
from ._server import RolloutServer
from ._servers import RestartHook, ServerState, ServerStatus
from ._session import AgentSession, AppendedTokens, Turn
from ._settings import SETTINGS
from ._toy import ToyEngine, ToyEngineConfig
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

__version__ = "0.1.0"

__all__ = [
    "AGENT_STATUSES",
    "AgentFn",
    "AgentLoop",
    "AgentLoopClosedError",
    "AgentLoopConfig",
    "AgentOutcome",
    "AgentSession",
    "AgentStatus",
    "AgentTask",
    "AppendedTokens",
    "ChatFront",
    "ChatHistoryError",
    "ChatServer",
    "ChatTemplate",
    "ChatTemplateError",
    "DuplicateServerError",
    "EngineHealth",
    "EngineNotInstalledError",
    "EngineStateError",
    "FINISH_REASONS",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "HFChatTemplate",
    "HermesToolCallParser",
    "NoLiveServerError",
    "PromptTooLongError",
    "RestartHook",
    "RewardFn",
    "RolloutClient",
    "RolloutConfigError",
    "RolloutEngine",
    "RolloutRequestError",
    "RolloutServer",
    "RolloutServerError",
    "RolloutTimeoutError",
    "RolloutTypeError",
    "Router",
    "RouterClosedError",
    "SETTINGS",
    "SamplingParams",
    "ScRolloutError",
    "ServerProcess",
    "ServerState",
    "ServerStatus",
    "ServerUnavailableError",
    "SessionStateError",
    "ToolCall",
    "ToolCallParser",
    "ToyEngine",
    "ToyEngineConfig",
    "Turn",
    "UnknownServerError",
    "UnknownSessionError",
    "UnservableModelError",
    "VLLMEngineConfig",
    "VLLMEnv",
    "WeightLoadError",
    "WeightMismatchError",
    "WeightUpdate",
    "WeightVersionError",
    "__version__",
    "create_vllm_env",
    "find_vllm_env",
    "serve",
    "vllm_argv",
    "vllm_env_vars",
]

_public.publish(globals())
