"""The values of an :class:`~sc_rollout.agents.AgentLoop`: what a session is given
(:class:`AgentTask`), what the caller's agent and reward functions are (:data:`AgentFn`,
:data:`RewardFn`), how a session ends (:class:`AgentOutcome`, :data:`AgentStatus`) and how the
loop is configured (:class:`AgentLoopConfig`)."""

from __future__ import annotations

import dataclasses
import math
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._errors import RolloutConfigError, RolloutRequestError, RolloutTypeError
from ..engines._types import SamplingParams, check_int
from ._session import AgentSession

__all__ = [
    "AGENT_STATUSES",
    "AgentFn",
    "AgentLoopConfig",
    "AgentOutcome",
    "AgentStatus",
    "AgentTask",
    "RewardFn",
]


#: how a session ended: its agent returned a reward; it ran past its deadline; its agent
#: (or the engine under it) raised; it was cancelled by :meth:`AgentLoop.cancel`
AgentStatus = Literal["done", "deadline", "error", "cancelled"]
AGENT_STATUSES: tuple[AgentStatus, ...] = ("done", "deadline", "error", "cancelled")


@dataclass(frozen=True)
class AgentTask:
    """One session to run: its ``prompt_ids``, the ``group`` it belongs to (the sessions of
    one prompt; a group's outcomes are taken together), and ``data``, anything the agent
    and the reward function need (the question, the expected answer). ``session_id``
    (default: a fresh one) names the session on every request."""

    prompt_ids: Sequence[int]
    group: str
    data: Any = None
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        for name in ("group", "session_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise RolloutTypeError(f"AgentTask.{name} must be a non-empty str, got {value!r}")
        values: object = self.prompt_ids
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise RolloutTypeError(
                f"AgentTask {self.session_id}: prompt_ids must be a sequence of token ids, got "
                f"{values!r}"
            )
        prompt = tuple(
            check_int(v, f"AgentTask {self.session_id}: prompt_ids[{i}]", 0)
            for i, v in enumerate(values)
        )
        if not prompt:
            raise RolloutRequestError(f"AgentTask {self.session_id}: prompt_ids is empty")
        object.__setattr__(self, "prompt_ids", prompt)


#: the user's agent: drives one session, returns its reward (``None``: the loop's reward
#: function scores the session)
AgentFn = Callable[[AgentTask, AgentSession], Awaitable["float | None"]]
#: scores a finished session (when the agent returns ``None``)
RewardFn = Callable[[AgentTask, AgentSession], float]


@dataclass(frozen=True)
class AgentOutcome:
    """How one session ended: its ``task``, its ``status`` (``"done"`` or why it was
    dropped), its ``reward`` (``None`` unless done), the rollout as
    :meth:`AgentSession.to_dict` gives it (what the session holds, also when dropped),
    ``detail`` (the error or the deadline, for a dropped session), and ``seconds`` from the
    session's start to its end."""

    task: AgentTask
    status: AgentStatus
    reward: float | None
    rollout: dict[str, Any]
    detail: str
    seconds: float

    @property
    def ok(self) -> bool:
        """Whether the session finished with a reward."""
        return self.status == "done"


@dataclass(frozen=True)
class AgentLoopConfig:
    """``max_concurrency``: sessions running at once (and threads for their requests);
    ``deadline_s``: how long one session may run, from its start (``None``: no deadline);
    ``sampling``: every session's sampling (with a ``seed``, each session samples with a
    seed derived from it and the session id, so that the sessions of a group differ and a
    run is reproducible)."""

    max_concurrency: int = 64
    deadline_s: float | None = 120.0
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        check_int(self.max_concurrency, "AgentLoopConfig.max_concurrency", 1, RolloutConfigError)
        deadline = self.deadline_s
        if deadline is not None:
            if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
                raise RolloutTypeError(
                    f"AgentLoopConfig.deadline_s must be a number or None, got {deadline!r}"
                )
            if not math.isfinite(deadline) or deadline <= 0:
                raise RolloutConfigError(
                    f"AgentLoopConfig.deadline_s must be > 0 and finite, got {deadline!r}"
                )
        if not isinstance(self.sampling, SamplingParams):
            raise RolloutTypeError(
                "AgentLoopConfig.sampling must be a SamplingParams, got "
                f"{type(self.sampling).__name__}"
            )

    def session_sampling(self, session_id: str) -> SamplingParams:
        """The sampling of session ``session_id`` (its own seed, if the config has one)."""
        seed = self.sampling.seed
        if seed is None:
            return self.sampling
        derived = zlib.crc32(f"{seed}:{session_id}".encode()) & 0x7FFFFFFF
        return dataclasses.replace(self.sampling, seed=derived)
