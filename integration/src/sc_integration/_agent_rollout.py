"""The trainer's agent rollout (``--task tool-calc``): each step's batch made of multi-turn
agent sessions on the rollout servers.

A step needs ``prompts_per_step`` groups of ``n`` sessions (one group per problem). The
rollout keeps ``prompts_per_step + extra_groups`` groups running on an
:class:`sc_rollout.AgentLoop` and takes the first ``prompts_per_step`` to finish
(*streaming*): with ``extra_groups`` = 0 the step waits for every session, its slowest agent
included. What is left over is cancelled when the run is synchronous (``staleness`` 0: the
next batch must come from the next weights), or keeps running across the weight push and
feeds the next step when ``staleness`` k > 0 (a group whose oldest token is more than k
versions behind the actor is dropped and replaced). Dropped sessions (deadline, error) stay
in the batch as empty rows (see ``_agent_batch``) and are counted in the step's metrics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from sc_protocol import DataProto
from sc_rollout import (
    AgentLoop,
    AgentLoopConfig,
    AgentOutcome,
    AgentSession,
    AgentTask,
    Router,
    SamplingParams,
)

from ._agent_batch import build_agent_batch
from ._errors import AgentRolloutError, TrainerConfigError

__all__ = ["AgentEnvironment", "AgentRollout"]


@runtime_checkable
class AgentEnvironment(Protocol):
    """What the trainer needs of an agent task (:class:`~sc_integration.ToolCalcTask` is
    one): the padded widths of a batch row, the pad token, each turn's token budget and stop
    tokens, the problems (``sample_train``, ``val_strings``), the sessions of some problems
    (``tasks``), and the two agents: ``agent`` returns the training reward, ``eval_agent``
    the task's score (validation)."""

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


class AgentRollout:
    """Batches of agent sessions of ``task`` over ``router`` (see the module's
    documentation). ``n`` sessions per problem; ``temperature`` and ``seed`` sample (each
    session's seed derives from ``seed`` and its id, so a run is reproducible);
    ``deadline_s`` bounds one session, ``max_concurrency`` the sessions running at once."""

    def __init__(
        self,
        router: Router,
        task: AgentEnvironment,
        *,
        prompts_per_step: int,
        n: int,
        extra_groups: int = 0,
        staleness: int = 0,
        temperature: float = 1.0,
        seed: int = 0,
        deadline_s: float | None = 120.0,
        max_concurrency: int = 64,
    ) -> None:
        for name, value, low in (
            ("prompts_per_step", prompts_per_step, 1),
            ("n", n, 1),
            ("extra_groups", extra_groups, 0),
            ("staleness", staleness, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise TrainerConfigError(
                    f"AgentRollout: {name} must be an int >= {low}, got {value!r}"
                )
        self.task = task
        self.prompts_per_step = prompts_per_step
        self.n = n
        self.extra_groups = extra_groups
        self.staleness = staleness
        self._seed = seed
        sampling = SamplingParams(
            max_tokens=task.turn_tokens,
            temperature=temperature,
            seed=seed,
            stop_token_ids=task.stop_token_ids,
        )
        self.loop = AgentLoop(
            router,
            task.agent,
            config=AgentLoopConfig(max_concurrency, deadline_s, sampling),
        )
        greedy = SamplingParams(
            max_tokens=task.turn_tokens, temperature=0.0, stop_token_ids=task.stop_token_ids
        )
        self._greedy = AgentLoop(
            router, task.eval_agent, config=AgentLoopConfig(max_concurrency, deadline_s, greedy)
        )
        self._draws = 0  # submissions so far (names each one's groups)

    def _top_up(self, step: int) -> None:
        """Submit groups until ``prompts_per_step + extra_groups`` are pending."""
        missing = self.prompts_per_step + self.extra_groups - self.loop.pending_groups()
        if missing <= 0:
            return
        problems = self.task.sample_train(missing, self._seed, step * 1000 + self._draws)
        tasks = self.task.tasks([str(p) for p in problems], f"s{step}d{self._draws}", self.n)
        self._draws += 1
        self.loop.submit(tasks)

    def batch(self, step: int, actor_version: int) -> tuple[DataProto, dict[str, Any]]:
        """Step ``step``'s batch (the actor is at ``actor_version``) and its ``agent/*``
        metrics; see the module's documentation."""
        taken: list[list[AgentOutcome]] = []
        stale = 0
        while len(taken) < self.prompts_per_step:
            self._top_up(step)
            groups = self.loop.take_groups(self.prompts_per_step - len(taken))
            for group in groups:
                if self._too_stale(group, actor_version):
                    stale += 1
                else:
                    taken.append(group)
        if self.staleness == 0:
            self.loop.discard()  # off-policy now: the next batch samples the next weights
        outcomes = [o for group in taken for o in group]
        batch = build_agent_batch(
            outcomes,
            prompt_length=self.task.prompt_length,
            response_length=self.task.response_length,
            pad_token_id=self.task.pad_token_id,
            meta_info={"global_step": step},
        )
        self._check_some_kept(step, batch, outcomes)
        metrics = self._metrics(batch, outcomes, stale)
        metrics["rollout/staleness"] = actor_version - int(batch.meta_info["weight_version"])
        return batch, metrics

    def _too_stale(self, group: Sequence[AgentOutcome], actor_version: int) -> bool:
        versions = [o.rollout["weight_version_min"] for o in group if o.ok]
        versions = [v for v in versions if v is not None]
        return bool(versions) and actor_version - min(versions) > self.staleness

    @staticmethod
    def _metrics(batch: DataProto, outcomes: Sequence[AgentOutcome], stale: int) -> dict[str, Any]:
        status = batch.non_tensor_batch["agent_status"]
        counts = Counter(str(s) for s in status)
        seconds = [o.seconds for o in outcomes]
        turns = np.asarray(batch.non_tensor_batch["agent_turns"], dtype=np.float64)
        done = status == "done"
        return {
            "agent/sessions": len(outcomes),
            "agent/dropped": len(outcomes) - counts.get("done", 0),
            "agent/dropped_deadline": counts.get("deadline", 0),
            "agent/dropped_error": counts.get("error", 0) + counts.get("too_long", 0),
            "agent/stale_groups": stale,
            "agent/tool_call_rate": float((turns[done] > 1).mean()) if done.any() else 0.0,
            "agent/session_s_mean": float(np.mean(seconds)),
            "agent/session_s_max": float(np.max(seconds)),
        }

    @staticmethod
    def _check_some_kept(step: int, batch: DataProto, outcomes: Sequence[AgentOutcome]) -> None:
        if any(o.ok for o in outcomes):
            return
        reasons = Counter(o.status for o in outcomes)
        first = next((o.detail for o in outcomes if o.detail), "")
        raise AgentRolloutError(
            f"step {step}: all {len(outcomes)} agent sessions were dropped "
            f"({dict(reasons)}); first: {first}"
        )

    def validate(self, problems: Sequence[str], step: int) -> float:
        """The mean task score of one greedy session per problem, without the training
        reward's tool-use bonus (a dropped session scores 0)."""
        tasks = self.task.tasks([str(p) for p in problems], f"val{step}", 1)
        self._greedy.submit(tasks)
        groups = self._greedy.take_all()
        rewards = [o.reward if o.ok and o.reward is not None else 0.0 for g in groups for o in g]
        return float(np.mean(rewards))

    def close(self) -> None:
        """Cancel every session still running and stop the loops."""
        try:
            self.loop.close()
        finally:
            self._greedy.close()
