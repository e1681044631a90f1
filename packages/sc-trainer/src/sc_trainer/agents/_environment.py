"""What the trainer needs of an agent task: :class:`AgentEnvironment`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
from sc_protocol import DataProto
from sc_rollout import AgentSession, AgentTask

from .._scores import BatchScores

__all__ = ["AgentEnvironment"]


@runtime_checkable
class AgentEnvironment(Protocol):
    """What the trainer needs of an agent task (:class:`~sc_trainer.tasks.ToolCalcTask` is
    one): the padded widths of a batch row, the pad token, each turn's token budget and stop
    tokens, the problems (``sample_train``, ``val_strings``), the sessions of some problems
    (``tasks``), the two agents (``agent`` returns the training reward, ``eval_agent`` the
    task's score, for validation) and the per-token reward of a batch of sessions
    (``score_batch``: each session's reward on its last model token)."""

    @property
    def prompt_length(self) -> int: ...

    @property
    def response_length(self) -> int: ...

    @property
    def pad_token_id(self) -> int: ...

    @property
    def turn_tokens(self) -> int: ...

    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...

    @property
    def val_strings(self) -> np.ndarray: ...

    def sample_train(self, n: int, seed: int, step: int) -> np.ndarray: ...

    def tasks(self, problems: Sequence[str], group: str, n: int) -> list[AgentTask]: ...

    async def agent(self, task: AgentTask, session: AgentSession) -> float: ...

    async def eval_agent(self, task: AgentTask, session: AgentSession) -> float: ...

    def score_batch(self, batch: DataProto) -> BatchScores: ...
