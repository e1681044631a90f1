"""The reference PPO/GRPO trainer, in the single-controller style.

:class:`RayPPOTrainer`'s ``init_workers`` turns the roles into typed worker groups (actor,
rollout and reference colocated in one process per rank, the critic with them or in a pool
of its own; see ``_roles``); ``fit`` is the training loop, written as plain sequential
Python on the driver. Every worker call is checked by mypy with ``sc_core.mypy_plugin``:
``self.actor_rollout_wg`` is a ``WorkerGroup[ActorRolloutRefWorker]``, so
``self.actor_rollout_wg.compute_log_prob(batch)`` takes and returns a ``DataProto``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sc_core import WorkerDiedError, WorkerError
from sc_protocol import DataProto
from sc_workers import (
    WeightSync,
    WeightSyncError,
)

from ._agent_rollout import AgentEnvironment, AgentRollout
from ._async_rollout import AsyncRollout
from ._errors import TrainerStateError
from ._output import RunOutput
from ._roles import build_worker_groups
from ._server_rollout import ServerRollout
from ._stages import (
    TIMING_PREFIXES,
    StageTimer,
    balance_batch,
    check_finite,
    compute_advantage,
    compute_reward,
    log_prob_gap,
    metrics_of,
    tensors_for,
)
from ._task import DigitsTask
from ._trainer_recovery import TrainerRecovery

__all__ = ["TIMING_PREFIXES", "RayPPOTrainer", "RunResult"]

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int, Mapping[str, Any]], None]


@dataclass
class RunResult:
    """What a finished run reports."""

    output: RunOutput
    final_step: int
    first_val_reward: float
    last_val_reward: float
    checkpoint: Path
    seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)
    #: seconds from the start of :meth:`TaskRunner.run` to the first step: cluster, workers
    #: (started, or re-attached to), models, restore
    startup_seconds: float = 0.0


class RayPPOTrainer(TrainerRecovery):
    """The PPO/GRPO loop on the driver; every stage is one call on a worker group.

    The name is verl's; ``launcher`` builds the worker groups on one backend (Ray actors or
    objects in this process), the loop is the same. The constructor, the worker groups and
    the weight sync are :class:`TrainerCore`'s; checkpoints, a detached run's take-over and
    recovery in place are the other parts it is built from (``_trainer_*.py``).
    """

    def init_workers(self) -> None:
        """Create the resource pools, then one worker group per role, and load the models.

        The actor, its rollout and the reference model are one worker (role
        ``actor_rollout_ref``), so they share a process per rank. A critic that shares their
        pool (``colocate``) is fused with them into one class with
        ``create_colocated_worker_cls``; ``spawn`` then gives one group per role over the
        same processes (see :func:`~sc_integration._roles.build_worker_groups`).
        """
        if self._groups is not None:
            raise TrainerStateError("RayPPOTrainer.init_workers: the workers are already up")
        self._groups = build_worker_groups(
            self.launcher,
            self.resource_pool_manager,
            self._classes,
            self.actor_rollout_ref_config,
            self.critic_config,
        )
        session = self._session
        if session is not None:
            session.use_on(self._groups.every_group())
            if session.attached:  # where the previous driver was (None: before any step)
                self._replay = session.read_state()
            session.record_driver(self._groups.owned, self._replay)
        if self._replay is None:  # re-attached workers keep their models
            self._init_models()
        cfg = self.config
        if cfg.rollout_engine != "workers" and cfg.model_path is not None:
            self._servers = ServerRollout(
                cfg.rollout_engine,
                cfg.model_path,
                cfg.rollout_servers,
                self.output.root,
                self.actor_rollout_ref_config.rollout,
                self.actor_rollout_ref_config.model,
                seed=cfg.seed,
                device=cfg.device,
                staleness=0 if isinstance(self.task, AgentEnvironment) else cfg.async_staleness,
            )
            if isinstance(self.task, AgentEnvironment):
                self._agents = AgentRollout(
                    self._servers.fleet.router,
                    self.task,
                    prompts_per_step=cfg.prompts_per_step,
                    n=cfg.responses_per_prompt,
                    extra_groups=cfg.agent_extra_groups,
                    staleness=cfg.async_staleness,
                    temperature=cfg.temperature,
                    seed=cfg.seed,
                    deadline_s=cfg.agent_deadline_s,
                )
        rollout = self._groups.rollout
        if rollout is not None:
            self._weight_sync = WeightSync(self.actor_rollout_wg, rollout)
            if self.config.async_staleness > 0:
                self._async = AsyncRollout(
                    rollout,
                    self._train_batch,
                    self.config.async_staleness,
                    self.config.steps,
                    call_scope=None if session is None else session.launch_scope,
                )

    def _generate(self, batch: DataProto, batch_id: str) -> DataProto:
        """``batch``'s responses; on servers, its requests are named ``<batch_id>-<row>``,
        which seeds their sampling (with the rollout's seed): a run is reproducible."""
        if self._servers is not None:
            return self._servers.generate_sequences(batch, batch_id=batch_id)
        rollout = self.rollout_wg
        if rollout is None:
            return self.actor_rollout_wg.generate_sequences(batch)
        return rollout.generate_sequences(batch)

    def close(self) -> None:
        """Stop every worker (spawned role groups share the workers of the groups owned here)."""
        pipeline, self._async = self._async, None
        if pipeline is not None:
            pipeline.close()
        agents, self._agents = self._agents, None
        if agents is not None:
            agents.close()
        servers, self._servers = self._servers, None
        if servers is not None:
            servers.close()
        sync, self._weight_sync = self._weight_sync, None
        if sync is not None:
            sync.close()
        groups, self._groups = self._groups, None
        if groups is None:
            return
        failure: BaseException | None = None
        for group in reversed(groups.owned):
            try:
                group.close()
            except BaseException as exc:  # close the others, then report the first failure
                failure = failure or exc
        if failure is not None:
            raise failure

    # -------------------------------------------------------------------- data
    def _prompt_batch(self, texts: np.ndarray, uid_prefix: str, meta: dict[str, Any]) -> DataProto:
        if not isinstance(self.task, DigitsTask):
            raise TrainerStateError("RayPPOTrainer: the tool task's batches are agent sessions")
        tensors = self.task.encode_prompts(texts)
        uids = np.array([f"{uid_prefix}-{i}" for i in range(len(texts))], dtype=object)
        return DataProto.from_dict(
            tensors=tensors,
            non_tensors={"prompt_text": np.asarray(texts, dtype=object), "uid": uids},
            meta_info=meta,
        )

    def _train_batch(self, step: int) -> DataProto:
        if not isinstance(self.task, DigitsTask):
            raise TrainerStateError("RayPPOTrainer: the tool task's batches are agent sessions")
        texts = self.task.sample_train(self.config.prompts_per_step, self.config.seed, step)
        batch = self._prompt_batch(texts, f"s{step}", {"global_step": step})
        return batch.repeat(repeat_times=self.config.responses_per_prompt, interleave=True)

    # -------------------------------------------------------------------- loop
    def _train_step(self, step: int) -> dict[str, Any]:
        """One PPO/GRPO step; each line is one stage of the dataflow."""
        m: dict[str, Any] = {"step": step}
        t = StageTimer(around=lambda stage: self._driver_phase(step, stage))
        pipeline = self._async
        servers = self._servers
        partial = servers if servers is not None and servers.partial else None
        agents = self._agents
        if agents is not None:
            with t("generate"):  # multi-turn sessions; the first groups to finish
                batch, agent_metrics = agents.batch(step, actor_version=step - 1)
            m.update(agent_metrics)
        elif partial is not None:
            with t("generate"):  # prefetched; the next one generates across this update
                batch, m["rollout/staleness"] = partial.take(
                    step, self.config.steps, self._train_batch
                )
            m["rollout/weight_version_max"] = int(max(batch.non_tensor_batch["weight_version_max"]))
            m["rollout/regenerated_rows"] = batch.meta_info["regenerated_rows"]
        elif pipeline is None:
            batch = self._train_batch(step)
            with t("generate"):  # prompts in, prompts + responses out (non-tensor columns kept)
                batch = self._generate(batch, f"s{step}")
        else:
            with t("generate"):  # the prefetched batch; the next one samples while we train
                batch, m["rollout/staleness"] = pipeline.take(step)
                if pipeline.allowed(step + 1):
                    pipeline.launch(step + 1)
        if "weight_version" in batch.meta_info:  # sampled by a separately placed rollout
            m["rollout/weight_version"] = batch.meta_info["weight_version"]
        with t("balance"):
            batch = balance_batch(batch, self.dp_size, m)
        with t("reward"):
            batch = compute_reward(self.task, batch, m)
        off_policy = partial is not None or (agents is not None and agents.staleness > 0)
        if pipeline is None and not off_policy:
            with t("old_log_prob"):
                batch = batch.union(self.actor_rollout_wg.compute_log_prob(batch))
            if self.config.temperature == 1.0:  # engines report log-probs before temperature
                log_prob_gap(batch, m)
        else:  # off-policy: the ratio is against the policy that sampled the batch
            td = tensors_for(batch, "off_policy")
            td["old_log_probs"] = td["rollout_log_probs"]
        with t("ref_log_prob"):
            batch = batch.union(self.ref_policy_wg.compute_ref_log_prob(batch))
        if self.use_critic:
            with t("values"):
                batch = batch.union(self.critic_wg.compute_values(batch))
        with t("advantages"):
            batch = compute_advantage(batch, m, self.config, self.use_critic)
        if self.use_critic:
            with t("update_critic"):
                m.update(metrics_of(self.critic_wg.update_critic(batch)))
        with t("update_actor"):
            m.update(metrics_of(self.actor_rollout_wg.update_actor(batch)))
        if self._servers is not None:
            with t("sync_weights"):  # the servers sample the next step with these weights
                self._sync_weights(m, step)
        elif self._weight_sync is not None and (
            pipeline is None or pipeline.needs_sync(step, validate=self._validates(step))
        ):
            if pipeline is not None:
                with t("generate"):  # the generation in flight ends before the sync
                    pipeline.drain()
            with t("sync_weights"):  # the rollout samples the next step with these weights
                self._sync_weights(m, step)
        m.update({f"timing/{k}": v for k, v in t.seconds.items()})
        m["perf/step_time_s"] = sum(t.seconds.values())
        check_finite(step, m)
        return m

    def validate(self) -> float:
        """Mean reward of greedy responses to the held-out prompts."""
        with self._driver_phase(self.global_step, "validate"):
            return self._validate()

    def _validate(self) -> float:
        texts = self.task.val_strings
        if self._agents is not None:
            return self._agents.validate(list(texts), self.global_step)
        batch = self._prompt_batch(texts, "val", {"do_sample": False})
        pad = (-len(batch)) % self.dp_size
        if pad:
            batch = DataProto.concat([batch, batch[:pad]])
        td = tensors_for(self._generate(batch, f"val{self.global_step}"), "validate")
        n = len(texts)
        task = self.task
        if not isinstance(task, DigitsTask):
            raise TrainerStateError("RayPPOTrainer.validate: the tool task validates by sessions")
        scores = task.score(texts, td["responses"][:n], td["response_mask"][:n])
        return float(scores.mean().item())

    def fit(
        self,
        progress: ProgressFn | None = None,
        on_start: Callable[[int], None] | None = None,
        resume_from: Path | None = None,
    ) -> RunResult:
        """Train to ``config.steps``, validating and checkpointing on the way.

        ``resume_from`` (a checkpoint folder) restores the workers, the step count and the
        metrics so far; the run then continues as if it had never stopped.
        """
        started = time.perf_counter()
        cfg = self.config
        # a re-attached driver takes over the step its predecessor was in
        replay = self._replay
        recovered: dict[str, Any] = {}
        if replay is not None:
            self._take_over(replay)
        elif resume_from is not None:
            self._load_checkpoint(resume_from)
        else:
            self.output.start()
        prologue = replay is None or replay.step == 0
        if prologue:
            self._begin_step(0)
            self._sync_weights({}, self.global_step)  # a separate rollout starts from the actor's
        if on_start is not None:
            on_start(self.global_step)
        if prologue:
            self._prologue(resume_from)
        if replay is not None and (replay.recovering or self._any_dead()):
            # a worker died while no driver was attached, or the last driver died recovering
            recovered = self._recover(replay.step, None)
        while True:
            step = self.global_step + 1
            try:
                self._begin_step(step)
                if self.global_step >= cfg.steps:
                    self._finish_save(block=True)  # the last checkpoint, complete
                    break
                self._inject_fault(step)
                metrics = self._train_step(step)
                self.global_step = step
                if self._validates(step):
                    metrics["val/reward"] = self.validate()
                metrics.update(recovered)
                recovered = {}
                self._log(metrics)
                if progress is not None:
                    progress(step, metrics)
                if step % cfg.save_every == 0 or step == cfg.steps:
                    self.save_checkpoint()
                else:
                    self._finish_save(block=False)  # the previous save, if its writes are done
            except (WorkerDiedError, WorkerError, WeightSyncError) as exc:
                if self._async is not None:  # prefetched batches are regenerated after it
                    self._async.drop()
                recovered = self._recover(step, exc)  # back at the newest checkpoint
                if progress is not None:
                    progress(self.global_step, recovered)
        if self._async is not None:
            self._async.drop()  # nothing is in flight past the last step; to be sure
        vals = [r["val/reward"] for r in self.history if "val/reward" in r]
        return RunResult(
            output=self.output,
            final_step=self.global_step,
            first_val_reward=vals[0],
            last_val_reward=vals[-1],
            checkpoint=self.output.checkpoint_dir(self.global_step),
            seconds=time.perf_counter() - started,
            history=list(self.history),
        )

    def _prologue(self, resume_from: Path | None) -> None:
        """Before the first step (after the first weight sync): the policy is validated,
        and a checkpoint is taken for a recovery to fall back to."""
        if not any("val/reward" in r for r in self.history):
            record = {"step": self.global_step, "val/reward": self.validate()}
            self._log(record)
        if resume_from is None or resume_from.parent != self.output.checkpoint_root:
            # the point a recovery falls back to before the first periodic checkpoint
            self.save_checkpoint()
            self._finish_save(block=True)

    def _validates(self, step: int) -> bool:
        """Whether the run validates after ``step``."""
        return step % self.config.val_every == 0 or step == self.config.steps

    def _log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        self.output.log_metrics(record)
        logger.info("step %s %s", record.get("step"), json.dumps(record, default=str))
