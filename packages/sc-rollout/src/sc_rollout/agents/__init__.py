"""Agent rollouts at the token level: one session, and many at once.

* :class:`AgentSession`: one agent's multi-turn rollout on any engine or router: model turns
  (:class:`Turn`) and appended tool tokens (:class:`AppendedTokens`), with the response mask
  and log-probs a trainer needs; never re-tokenized.
* :class:`AgentLoop`: many agent sessions at once (an ``async`` :data:`AgentFn` per
  :class:`AgentTask`, or a :data:`RewardFn`), bounded, each with a deadline, configured by
  :class:`AgentLoopConfig`; every session ends in one :class:`AgentOutcome` (an
  :data:`AgentStatus` of :data:`AGENT_STATUSES`: done with its reward, or dropped with the
  reason), and groups are taken as they finish, so a batch need not wait for the slowest
  agents.
"""

from __future__ import annotations

from sc_dispatch import _public

from ._agent_loop import AgentLoop
from ._agent_tasks import (
    AGENT_STATUSES,
    AgentFn,
    AgentLoopConfig,
    AgentOutcome,
    AgentStatus,
    AgentTask,
    RewardFn,
)
from ._session import AgentSession, AppendedTokens, Turn

__all__ = [
    "AGENT_STATUSES",
    "AgentFn",
    "AgentLoop",
    "AgentLoopConfig",
    "AgentOutcome",
    "AgentSession",
    "AgentStatus",
    "AgentTask",
    "AppendedTokens",
    "RewardFn",
    "Turn",
]

_public.publish(globals())
