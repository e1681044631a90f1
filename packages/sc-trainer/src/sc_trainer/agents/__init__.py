"""Agent tasks: multi-turn, tool-using sessions as the trainer's rollout source.

:class:`AgentEnvironment` is what the trainer needs of an agent task
(:class:`~sc_trainer.tasks.ToolCalcTask` is one); :class:`AgentRollout` runs its sessions on
the engine servers with :class:`sc_rollout.AgentLoop` and makes each step's batch of them;
:func:`build_agent_batch` lays sessions out as the rollout worker's rows, the tool's tokens
out of the loss, and :func:`agent_token_scores` pays each session's reward on its last model
token.
"""

from sc_dispatch import _public

from .._errors import AgentRolloutError
from ._batch import agent_token_scores, build_agent_batch
from ._environment import AgentEnvironment
from ._rollout import AgentRollout

__all__ = [
    "AgentEnvironment",
    "AgentRollout",
    "AgentRolloutError",
    "agent_token_scores",
    "build_agent_batch",
]

_public.publish(globals())
