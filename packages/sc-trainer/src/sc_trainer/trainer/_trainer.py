"""The reference PPO/GRPO trainer, in the single-controller style.

:class:`RayPPOTrainer`'s ``init_workers`` turns the roles into typed worker groups (``_roles``)
and picks the run's rollout source (``_sources``); ``fit`` is the training loop, plain
sequential Python on the driver. It holds its parts: the rollout source every batch comes
from, the checkpointer, the recovery that brings dead workers back, and for a detached run
the :class:`~sc_trainer.runs.DetachedRun` a new driver re-attaches through. Every worker call
is checked by mypy with ``sc_core.mypy_plugin`` (``self.actor_rollout_wg`` is a
``WorkerGroup[ActorRolloutRefWorker]``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sc_core import ResourcePoolManager, WorkerDiedError, WorkerError, WorkerGroup
from sc_protocol import DataProto
from sc_workers import ActorRolloutRefWorker, CriticWorker, RolloutWorker, WeightSyncError

from .._errors import TrainerRecoveryError, TrainerStateError
from ..config import TrainerConfig
from ..faults import InjectedFaults, Recovery
from ..rollout import EngineServers, RolloutSource
from ..runs import Checkpointer, DetachedRun, RunOutput, RunState, latest_checkpoint
from ..tasks import Task, data_state
from ._launcher import Launcher
from ._result import MetricsSink, ProgressFn, RunResult
from ._roles import Role, TrainerGroups, build_worker_groups, role_classes, worker_configs
from ._sources import make_rollout_source
from ._stages import (
    StageTimer,
    apply_rollout_correction,
    balance_batch,
    check_exact,
    check_finite,
    compute_advantage,
    compute_reward,
    metrics_of,
    response_metrics,
    rollout_mismatch,
    tensors_for,
)

__all__ = ["RayPPOTrainer"]

logger = logging.getLogger(__name__)


class RayPPOTrainer:
    """The PPO/GRPO loop on the driver; every stage is one call on a worker group.

    The name is verl's; ``launcher`` builds the worker groups on one backend (Ray actors or
    objects in this process), the loop is the same whatever the backend and wherever the
    batches come from.
    """

    def __init__(
        self,
        config: TrainerConfig,
        task: Task,
        role_worker_mapping: Mapping[Role, type],
        resource_pool_manager: ResourcePoolManager,
        launcher: Launcher,
        output: RunOutput,
        *,
        tracking: MetricsSink | None = None,
    ) -> None:
        self.config = config
        #: where each step's metrics go besides ``metrics.jsonl`` (the experiment trackers)
        self.tracking = tracking
        self.task = task
        self.role_worker_mapping = dict(role_worker_mapping)
        self._classes = role_classes(self.role_worker_mapping)
        self.resource_pool_manager = resource_pool_manager
        self.launcher = launcher
        self.output = output
        self.use_critic = self._classes.critic is not None
        self.dp_size = config.workers_per_role
        self.actor_rollout_ref_config, self.critic_config = worker_configs(config, task)
        self.global_step = 0
        self.history: list[dict[str, Any]] = []
        #: recovery in place after a worker's death (at most ``config.max_recoveries``)
        self.recovery = Recovery(config.max_recoveries)
        #: the faults injected on purpose: workers', the driver's, nodes', rewards'
        self.faults = InjectedFaults(config.faults, config.inject_fault, config.node_faults)
        #: a detached run's call ids, scopes and run state (None: not detached)
        driver = launcher.driver
        self.detached = None if driver is None else DetachedRun(driver)
        self._groups: TrainerGroups | None = None
        #: where every batch comes from (after :meth:`init_workers`)
        self.rollout: RolloutSource | None = None
        #: the engine servers the rollout generates on (None: it generates on worker groups)
        self.servers: EngineServers | None = None
        self.checkpointer: Checkpointer | None = None
        #: when the trainer was made (``perf/wall_clock_s`` counts from here)
        self._started = time.perf_counter()

    # ------------------------------------------------------------------ workers
    def init_workers(self) -> None:
        """Create the resource pools, then one worker group per role; load the models (a
        re-attached driver's workers keep theirs) and start the rollout source.

        The actor, its rollout and the reference model are one worker (role
        ``actor_rollout_ref``), so they share a process per rank. A critic that shares their
        pool (``colocate``) is fused with them into one class with
        ``create_colocated_worker_cls``; ``spawn`` then gives one group per role over the
        same processes (see :func:`~sc_trainer.trainer.build_worker_groups`).
        """
        if self._groups is not None:
            raise TrainerStateError("RayPPOTrainer.init_workers: the workers are already up")
        cfg = self.config
        self._groups = groups = build_worker_groups(
            self.launcher,
            self.resource_pool_manager,
            self._classes,
            self.actor_rollout_ref_config,
            self.critic_config,
        )
        replay = None
        if self.detached is not None:
            replay = self.detached.adopt(groups.every_group(), groups.owned)
        if replay is None:  # re-attached workers keep their models
            self._workers("init_models").init_models()
        self.checkpointer = Checkpointer(
            self.output,
            groups.actor_rollout,
            groups.critic,
            background=cfg.background_checkpoints,
            keep=cfg.keep_checkpoints,
            phase=self._phase,
            save_hf=cfg.save_hf,
        )
        self.rollout, self.servers = make_rollout_source(
            cfg, self.task, groups, self.output.root, self.actor_rollout_ref_config, self.detached
        )
        if self.detached is not None and self.servers is not None:
            self.detached.record_servers(self.servers)

    def _workers(self, attribute: str) -> TrainerGroups:
        if self._groups is None:
            raise TrainerStateError(
                f"RayPPOTrainer.{attribute}: no worker groups; call init_workers first (and "
                "not after close)"
            )
        return self._groups

    @property
    def actor_rollout_wg(self) -> WorkerGroup[ActorRolloutRefWorker]:
        """The actor/rollout/reference group (after :meth:`init_workers`)."""
        return self._workers("actor_rollout_wg").actor_rollout

    @property
    def ref_policy_wg(self) -> WorkerGroup[ActorRolloutRefWorker]:
        """The reference policy's group: the actor's, the reference lives in its process."""
        return self._workers("ref_policy_wg").actor_rollout

    @property
    def critic_wg(self) -> WorkerGroup[CriticWorker]:
        """The critic's group (PPO only, after :meth:`init_workers`)."""
        critic = self._workers("critic_wg").critic
        if critic is None:
            raise TrainerStateError(
                "RayPPOTrainer.critic_wg: role_worker_mapping has no Role.Critic (algorithm "
                f"{self.config.algorithm!r} runs no critic)"
            )
        return critic

    @property
    def rollout_wg(self) -> WorkerGroup[RolloutWorker] | None:
        """The separately placed rollout group (``placement="separate"``), else None: the
        actor's group samples."""
        return self._workers("rollout_wg").rollout

    @property
    def recoveries(self) -> int:
        """Worker deaths this run recovered from."""
        return self.recovery.count

    def _parts(self, where: str) -> tuple[RolloutSource, Checkpointer]:
        if self.rollout is None or self.checkpointer is None:
            raise TrainerStateError(
                f"RayPPOTrainer.{where}: no rollout source; call init_workers first (and not "
                "after close)"
            )
        return self.rollout, self.checkpointer

    # --------------------------------------------------------------------- loop
    def _train_step(self, step: int) -> dict[str, Any]:
        """One PPO/GRPO step; each line is one stage of the dataflow."""
        m: dict[str, Any] = {"step": step}
        t = StageTimer(around=lambda stage: self._phase(step, stage))
        rollout, _ = self._parts("fit")
        batch, rollout_metrics = rollout.take(step, t)  # prompts + responses ("generate")
        m.update(rollout_metrics)
        response_metrics(batch, m)
        if "weight_version" in batch.meta_info:  # sampled by a rollout with its own weights
            m["rollout/weight_version"] = batch.meta_info["weight_version"]
        with t("balance"):
            batch = balance_batch(batch, self.dp_size, m)
        with t("reward"):
            batch = compute_reward(self.task, batch, m)
        batch, measured = self._old_log_prob(batch, rollout.on_policy, t, m)
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
            if measured:
                batch = apply_rollout_correction(batch, self.config.rollout_correction, m)
            m.update(metrics_of(self.actor_rollout_wg.update_actor(batch)))
        # the sampler gets these weights ("sync_weights")
        m.update(rollout.after_update(step, t, validates=self._validates(step)))
        m.update({f"timing/{k}": v for k, v in t.seconds.items()})
        m["perf/step_time_s"] = sum(t.seconds.values())
        m["perf/throughput_tokens_s"] = m["perf/tokens"] / max(m["perf/step_time_s"], 1e-9)
        m["perf/wall_clock_s"] = time.perf_counter() - self._started
        check_finite(step, m)
        return m

    def _old_log_prob(
        self, batch: DataProto, on_policy: bool, t: StageTimer, m: dict[str, Any]
    ) -> tuple[DataProto, bool]:
        """The PPO ratio's old log-probs: the actor's own, recomputed, when the batch was
        sampled with its current weights, or when a rollout correction is on (it weighs the
        sampler's log-probs, token by token, against them); else the sampling policy's
        (``rollout_log_probs``). Also whether the mismatch between the two was measured
        (``rollout/log_prob_diff_*``, ``rollout_corr/*``)."""
        corrected = self.config.rollout_correction.enabled
        if not on_policy and not corrected:
            td = tensors_for(batch, "off_policy")
            td["old_log_probs"] = td["rollout_log_probs"]
            return batch, False
        with t("old_log_prob"):
            batch = batch.union(self.actor_rollout_wg.compute_log_prob(batch))
        rollout_mismatch(batch, m, self.config.rollout_correction)
        if self.config.exact_check:
            check_exact(batch, m["step"])
        return batch, True

    def validate(self) -> float:
        """Mean reward of greedy responses to the held-out prompts."""
        rollout, _ = self._parts("validate")
        with self._phase(self.global_step, "validate"):
            batch = rollout.validation_batch(self.global_step)
            scores = self.task.score_batch(batch).token_scores
            return float(scores.sum(dim=-1).mean().item())

    def fit(
        self,
        progress: ProgressFn | None = None,
        on_start: Callable[[int], None] | None = None,
        resume_from: Path | None = None,
    ) -> RunResult:
        """Train to ``config.steps``, validating and checkpointing on the way.

        ``resume_from`` (a checkpoint folder) restores the workers, the step count and the
        metrics so far; the run then continues as if it had never stopped. A re-attached
        driver takes over the step its predecessor was in.
        """
        started = time.perf_counter()
        cfg = self.config
        rollout, checkpointer = self._parts("fit")
        replay = None if self.detached is None else self.detached.replay
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
            rollout.start(self.global_step)  # the sampler starts from the actor's weights
        if on_start is not None:
            on_start(self.global_step)
        if prologue:
            self._prologue(resume_from)
        if replay is not None and (replay.recovering or self._workers("fit").any_dead()):
            # a worker died while no driver was attached, or the last driver died recovering
            recovered = self._recover(replay.step, None)
        while True:
            step = self.global_step + 1
            try:
                self._begin_step(step)
                if self.global_step >= cfg.total_steps:
                    checkpointer.finish(block=True)  # the last checkpoint, complete
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
                if step % cfg.save_every == 0 or step == cfg.total_steps:
                    self.save_checkpoint()
                else:
                    checkpointer.finish(block=False)  # the previous save, if its writes are done
            except (WorkerDiedError, WorkerError, WeightSyncError) as exc:
                recovered = self._recover(step, exc)  # back at the newest checkpoint
                if progress is not None:
                    progress(self.global_step, recovered)
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
            self._parts("fit")[1].finish(block=True)

    def _validates(self, step: int) -> bool:
        """Whether the run validates after ``step``."""
        return step % self.config.val_every == 0 or step == self.config.total_steps

    def _log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        self.output.log_metrics(record)
        if self.tracking is not None:
            self.tracking.log(record, int(record["step"]))
        logger.info("step %s %s", record.get("step"), json.dumps(record, default=str))

    # -------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        """Worker state (per rank), trainer state and the metrics so far, in
        ``checkpoint_dir(global_step)``; returns that folder (complete once the workers'
        background writes are: :class:`~sc_trainer.runs.Checkpointer`)."""
        _, checkpointer = self._parts("save_checkpoint")
        state = {"global_step": self.global_step, "config": asdict(self.config)}
        data = data_state(self.task, self.global_step)
        if data is not None:  # a dataset run: where in its data it is
            state["data"] = data
        return checkpointer.save(self.global_step, state, self.history)

    def _load_checkpoint(self, folder: Path) -> None:
        step, history = self._parts("fit")[1].load(folder, self.config)
        self.global_step = step
        self.history = history
        self.output.start(self.history)

    # ------------------------------------------------------- detached runs
    def _begin_step(self, step: int, recovering: bool = False) -> None:
        """A detached run: a new call scope for ``step`` (the replayed one after a
        re-attach), and the run state written before the step's first call."""
        if self.detached is None:
            return
        rollout, checkpointer = self._parts("fit")
        self.detached.begin_step(
            step,
            global_step=self.global_step,
            recoveries=self.recovery.count,
            pending=checkpointer.pending,
            rollout=rollout.snapshot(),
            recovering=recovering,
        )
        if not recovering:
            self.faults.at_start(step)

    def _take_over(self, state: RunState) -> None:
        """Continue where the previous driver of this detached run was when ``state`` was
        written: its step and call scope, metrics, pending checkpoint and versions."""
        if self.detached is None:
            raise TrainerStateError("RayPPOTrainer: only a detached run is taken over")
        rollout, checkpointer = self._parts("fit")
        self.history = self.detached.take_over(state, self.output, checkpointer, rollout)
        self.global_step = state.global_step
        self.recovery.count = state.recoveries

    # ------------------------------------------------------------ recovery
    def _phase(self, step: int, phase: str) -> contextlib.AbstractContextManager[None]:
        """Phase ``phase`` of step ``step``: where an injected fault loses a node or kills
        the driver (each fires once)."""
        return self.faults.phase(step, phase)

    def _inject_fault(self, step: int) -> None:
        """Inject the faults of the run whose step begins (:class:`InjectedFaults`)."""
        servers = None if self.servers is None else self.servers.fleet
        self.faults.inject(step, self._workers("inject_fault"), self.task, servers)

    def _recover(self, step: int, error: BaseException | None) -> dict[str, Any]:
        """Bring the workers back after ``error`` (a death during ``step``, or ``None``: one
        a re-attached driver found) and restore the newest complete checkpoint; returns the
        ``recovery/*`` metrics (see :class:`~sc_trainer.faults.Recovery`)."""
        groups = self._workers("recover")
        rollout, checkpointer = self._parts("recover")

        def prepare(what: str) -> Path:
            rollout.drop()  # prefetched batches are regenerated after it
            if self.detached is not None:  # nor are the generations launched before it
                self.detached.forget_launches()
            self._begin_step(step, recovering=True)  # a detached run: redo it if we die
            checkpointer.settle()  # complete on disk, or abandoned
            latest = latest_checkpoint(self.output.checkpoint_root)
            if latest is None:  # fit saves one before the first step; someone removed it
                raise TrainerRecoveryError(
                    f"step {step}: {what}, and {self.output.checkpoint_root} holds no complete "
                    "checkpoint to recover from"
                ) from error
            return latest

        def restore(checkpoint: Path) -> int:
            self._workers(
                "init_models"
            ).init_models()  # builds what the re-formed groups dropped; the rest keep theirs
            self._load_checkpoint(checkpoint)
            rollout.start(self.global_step)  # the sampler gets the restored weights
            return self.global_step

        return self.recovery.recover(step, error, groups.owned, prepare, restore)

    # ---------------------------------------------------------------- the end
    def close(self, *, detach: bool = False) -> None:
        """Stop the rollout source and every worker (spawned role groups share the workers
        of the groups owned here); ``detach``: a detached run's driver that stops leaves its
        workers to the next driver, only the driver-side threads end."""
        self.faults.close()  # node losses armed and never fired
        rollout, self.rollout, self.servers = self.rollout, None, None
        self.checkpointer = None
        groups, self._groups = self._groups, None
        failure: BaseException | None = None
        if rollout is not None:
            try:
                rollout.close(detach=detach)
            except BaseException as exc:  # the workers are stopped all the same
                failure = exc
        for group in reversed(() if groups is None or detach else groups.owned):
            try:
                group.close()
            except BaseException as exc:  # close the others, then report the first failure
                failure = failure or exc
        if failure is not None:
            raise failure

    def detach(self) -> None:
        """:meth:`close` without stopping the workers (a detached run's driver that stops)."""
        self.close(detach=True)
