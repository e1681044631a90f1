"""sc-rollout: rollout engines behind an HTTP server, and a router over the servers.

The names a user writes most are here; each concern has a second tier with the rest:

* :mod:`sc_rollout.engines`: the rollout-engine contract, :class:`RolloutEngine`: generate
  from token ids with :class:`SamplingParams` (:class:`GenerateRequest` in,
  :class:`GenerateResult` out: token ids, their log-probs and the weight version they ran
  under), abort, pause and resume, load weights at a version (:class:`WeightUpdate`),
  health, sleep and wake up; and the vLLM engine's configuration
  (:class:`VLLMEngineConfig`) and environment.
* :mod:`sc_rollout.serving`: :class:`RolloutServer` puts any engine behind an
  OpenAI-compatible token-in-token-out endpoint (``POST /v1/completions`` with ``prompt`` a
  list of token ids) plus control endpoints; :class:`ServerProcess` runs one in a process of
  its own (``python -m sc_rollout``); :class:`RolloutClient` is a server seen as an engine.
* :mod:`sc_rollout.routing`: :class:`Router` spreads requests over servers: sticky by
  session, least in flight otherwise, servers added and drained at runtime, dead ones
  retried elsewhere, restarted through the owner's hook and re-synced to the current weights.
* :mod:`sc_rollout.agents`: :class:`AgentSession`, one agent's multi-turn rollout at the
  token level, on any engine or router (model turns, :class:`Turn`, and appended tool
  tokens), with the response mask and log-probs a trainer needs, never re-tokenized;
  :class:`AgentLoop`, many agent sessions at once (an ``async`` agent function per
  :class:`AgentTask`, configured by :class:`AgentLoopConfig`), bounded, each with a
  deadline, every session ending in one :class:`AgentOutcome`.
* :mod:`sc_rollout.chat`: :class:`ChatFront` and :class:`ChatServer`, an OpenAI-compatible
  chat-completions front (tool calls in the request and the answer) that records each
  conversation as an :class:`AgentSession`; chat templates and tool-call parsers.
* :mod:`sc_rollout.errors`: every error, all subclasses of :class:`ScRolloutError`.
* :mod:`sc_rollout.testing`: the test doubles, ``ToyEngine`` (a seeded sampler over a tiny
  vocabulary, not a model) and ``ScriptedChatEngine``.

:data:`SETTINGS` are the environment variables sc-rollout reads. Depends on sc-dispatch only
(no torch, no Ray, no vLLM).
"""

from __future__ import annotations

from sc_dispatch import _public

from ._settings import SETTINGS
from .agents import AgentLoop, AgentLoopConfig, AgentOutcome, AgentSession, AgentTask, Turn
from .chat import ChatFront, ChatServer
from .engines import (
    GenerateRequest,
    GenerateResult,
    RolloutEngine,
    SamplingParams,
    VLLMEngineConfig,
    WeightUpdate,
)
from .errors import ScRolloutError
from .routing import Router
from .serving import RolloutClient, RolloutServer, ServerProcess

__version__ = "0.1.0"

__all__ = [
    "AgentLoop",
    "AgentLoopConfig",
    "AgentOutcome",
    "AgentSession",
    "AgentTask",
    "ChatFront",
    "ChatServer",
    "GenerateRequest",
    "GenerateResult",
    "RolloutClient",
    "RolloutEngine",
    "RolloutServer",
    "Router",
    "SETTINGS",
    "SamplingParams",
    "ScRolloutError",
    "ServerProcess",
    "Turn",
    "VLLMEngineConfig",
    "WeightUpdate",
    "__version__",
]

_public.publish(globals())
