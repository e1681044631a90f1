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
in the batch as empty rows (see ``_batch.py``) and are counted in the step's metrics.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from sc_protocol import DataProto
from sc_rollout import AgentLoop, AgentLoopConfig, AgentOutcome, Router, SamplingParams

from .._errors import AgentRolloutError, int_at_least
from ..rollout import EngineServers, RolloutSnapshot, Stage
from ._batch import build_agent_batch
from ._environment import AgentEnvironment

__all__ = ["AgentRollout"]

logger = logging.getLogger(__name__)


class AgentRollout:
    """The rollout source of an agent task: batches of agent sessions of ``task`` over
    ``router`` (see the module's documentation). ``n`` sessions per problem; ``temperature``
    and ``seed`` sample (each session's seed derives from ``seed`` and its id, so a run is
    reproducible); ``deadline_s`` bounds one session, ``max_concurrency`` the sessions
    running at once. ``servers``: the engine servers behind ``router``, which get the
    actor's weights after every update and stop with :meth:`close` (``None``: the caller
    owns the servers and their weights)."""

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
        servers: EngineServers | None = None,
    ) -> None:
        for name, value, low in (
            ("prompts_per_step", prompts_per_step, 1),
            ("n", n, 1),
            ("extra_groups", extra_groups, 0),
            ("staleness", staleness, 0),
        ):
            int_at_least(value, low, f"AgentRollout: {name}")
        self.task = task
        self.servers = servers
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
        batch = self._batch(outcomes, step)
        self._check_some_kept(step, batch, outcomes)
        metrics = self._metrics(batch, outcomes, stale)
        metrics["rollout/staleness"] = actor_version - int(batch.meta_info["weight_version"])
        return batch, metrics

    def _actor_version(self, weight_version: int) -> int:
        servers = self.servers
        return weight_version if servers is None else servers.actor_version(weight_version)

    def _too_stale(self, group: Sequence[AgentOutcome], actor_version: int) -> bool:
        versions = [o.rollout["weight_version_min"] for o in group if o.ok]
        versions = [self._actor_version(v) for v in versions if v is not None]
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

    # ------------------------------------------------------------ the source
    @property
    def on_policy(self) -> bool:
        """Synchronous (``staleness`` 0): every session samples the actor's current weights;
        with a bound, left-over groups that ran across a weight push are trained on too."""
        return self.staleness == 0

    def start(self, version: int) -> None:
        """The servers take the actor's weights of ``version``."""
        if self.servers is not None:
            self.servers.push(version)

    def drop(self) -> None:
        """A recovery begins: the sessions running or held past the last batch sampled
        weights the run goes back from; they are cancelled and forgotten."""
        dropped = self.loop.discard()
        if dropped:
            logger.info("agent rollout: dropped %d prompt groups before a recovery", dropped)

    def take(self, step: int, stage: Stage) -> tuple[DataProto, dict[str, Any]]:
        with stage("generate"):  # multi-turn sessions; the first groups to finish
            return self.batch(step, actor_version=step - 1)

    def after_update(self, step: int, stage: Stage, validates: bool) -> dict[str, Any]:
        if self.servers is None:
            return {}
        with stage("sync_weights"):  # the sessions sample the next step with these weights
            self.servers.push(step)
        return {"sync/weight_version": step}

    def validation_batch(self, step: int, problems: Sequence[str] | None = None) -> DataProto:
        """One greedy session per held-out problem (``problems``: these instead), scored by
        the task's ``eval_agent`` without the training reward's tool-use bonus; a dropped
        session's row earns nothing."""
        chosen = self.task.val_strings if problems is None else problems
        tasks = self.task.tasks([str(p) for p in chosen], f"val{step}", 1)
        self._greedy.submit(tasks)
        order = {task.session_id: row for row, task in enumerate(tasks)}
        outcomes = [o for group in self._greedy.take_all() for o in group]
        outcomes.sort(key=lambda o: order[o.task.session_id])  # the problems' order
        return self._batch(outcomes, step)

    def _batch(self, outcomes: Sequence[AgentOutcome], step: int) -> DataProto:
        """The batch of ``outcomes`` (step ``step``), its weight versions the actor's."""
        batch = build_agent_batch(
            outcomes,
            prompt_length=self.task.prompt_length,
            response_length=self.task.response_length,
            pad_token_id=self.task.pad_token_id,
            meta_info={"global_step": step},
        )
        return batch if self.servers is None else self.servers.in_actor_versions(batch)

    def snapshot(self) -> RolloutSnapshot:
        """The servers' names and push bookkeeping (a detached run's re-attach)."""
        servers = None if self.servers is None else self.servers.snapshot()
        return RolloutSnapshot(servers=servers)

    def restore(self, snapshot: RolloutSnapshot) -> None:
        """Continue a detached run's servers where the previous driver left them
        (:meth:`~sc_trainer.rollout.EngineServers.resume`)."""
        if self.servers is not None and snapshot.servers is not None:
            self.servers.resume(snapshot.servers)

    def close(self, *, detach: bool = False) -> None:
        """Cancel every session still running, stop the loops and the servers (``detach``:
        a detached run's driver that stops leaves the servers to the next driver)."""
        try:
            self.loop.close()
        finally:
            try:
                self._greedy.close()
            finally:
                if self.servers is not None:
                    self.servers.close(detach=detach)
