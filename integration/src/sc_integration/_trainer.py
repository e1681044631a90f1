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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sc_core import ResourcePoolManager, WorkerDiedError, WorkerError, WorkerGroup, driver_span
from sc_protocol import DataProto
from sc_workers import (
    ActorRolloutRefWorker,
    CriticWorker,
    RolloutWorker,
    WeightSync,
    WeightSyncError,
)

from ._agent_rollout import AgentEnvironment, AgentRollout
from ._async_rollout import AsyncRollout
from ._config import TrainerConfig
from ._driver_faults import DriverFault, fire_driver_fault
from ._errors import TrainerRecoveryError, TrainerStateError
from ._faults import FaultSpec, inject_due
from ._launchers import Launcher
from ._output import PendingSave, RunOutput, check_resumable, read_metrics
from ._recovery import latest_checkpoint, replace_dead, wait_for_dead
from ._roles import Role, TrainerGroups, build_worker_groups, role_classes, worker_configs
from ._run_state import AsyncState, RunState
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


class RayPPOTrainer:
    """The PPO/GRPO loop on the driver; every stage is one call on a worker group.

    The name is verl's; ``launcher`` builds the worker groups on one backend (Ray actors or
    objects in this process), the loop is the same.
    """

    def __init__(
        self,
        config: TrainerConfig,
        task: DigitsTask | AgentEnvironment,
        role_worker_mapping: Mapping[Role, type],
        resource_pool_manager: ResourcePoolManager,
        launcher: Launcher,
        output: RunOutput,
    ) -> None:
        self.config = config
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
        self._groups: TrainerGroups | None = None
        self._weight_sync: WeightSync | None = None
        #: worker deaths this run recovered from (at most ``config.max_recoveries``)
        self.recoveries = 0
        self._faults: list[FaultSpec] = list(config.faults)  # each injected once
        #: faults that kill this driver (a detached run's re-attach tests)
        self._driver_faults = DriverFault.parse_all(config.inject_fault)
        #: a detached run's call ids, call scopes and run state (None: not detached)
        self._session = launcher.session
        #: a re-attached driver: the state its predecessor wrote as its last step began
        self._replay: RunState | None = None
        #: a checkpoint whose workers may still be writing (see save_checkpoint)
        self._pending_save: PendingSave | None = None
        #: the generation pipeline of an asynchronous run (async_staleness > 0)
        self._async: AsyncRollout | None = None
        #: the engine servers that generate (rollout_engine builtin or vllm), with partial
        #: rollout when async_staleness > 0
        self._servers: ServerRollout | None = None
        #: the agent sessions of the tool task, on those servers
        self._agents: AgentRollout | None = None

    # ----------------------------------------------------------------- workers
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
            session.record_driver(self._groups.owned)
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

    def _init_models(self) -> None:
        """Every role's ``init_model`` (idempotent: a rank that has its model keeps it)."""
        self.actor_rollout_wg.init_model()
        if self.use_critic:
            self.critic_wg.init_model()
        if self.rollout_wg is not None:
            self.rollout_wg.init_model()

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

    def _generate(self, batch: DataProto, batch_id: str) -> DataProto:
        """``batch``'s responses; on servers, its requests are named ``<batch_id>-<row>``,
        which seeds their sampling (with the rollout's seed): a run is reproducible."""
        if self._servers is not None:
            return self._servers.generate_sequences(batch, batch_id=batch_id)
        rollout = self.rollout_wg
        if rollout is None:
            return self.actor_rollout_wg.generate_sequences(batch)
        return rollout.generate_sequences(batch)

    def _sync_weights(self, metrics: dict[str, Any], actor_version: int) -> None:
        """Bring a separately placed rollout to the actor's current weights (those of
        ``actor_version``, its number of updates), after the generation in flight; or push
        them to the engine servers."""
        if self._servers is not None:
            # its time is the step's timing/sync_weights
            self._servers.push_weights(self.actor_rollout_wg, actor_version)
            metrics["sync/weight_version"] = actor_version
        if self._weight_sync is not None:
            if self._async is not None:
                self._async.drain()  # the rollout ends its generation before it takes weights
            version = self._weight_sync.sync()
            metrics["sync/weight_version"] = version
            if self._async is not None:
                self._async.synced(version, actor_version)

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
        t = StageTimer(on_enter=lambda stage: self._driver_fault(step, stage))
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
        self._driver_fault(self.global_step, "validate")
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

    # ------------------------------------------------------------ detached runs
    def _begin_step(self, step: int, recovering: bool = False) -> None:
        """A detached run: a new call scope for ``step`` (the replayed one after a
        re-attach), and the run state written before the step's first call."""
        session = self._session
        if session is None:
            return
        scope = session.begin_step()
        session.write(self._run_state(step, scope, recovering))
        if not recovering:
            self._driver_fault(step, "start")

    def _driver_fault(self, step: int, phase: str) -> None:
        if self._driver_faults:
            fire_driver_fault(self._driver_faults, step, phase)

    def _run_state(self, step: int, scope: int, recovering: bool) -> RunState:
        """What a new driver needs to take over ``step`` (see ``_run_state.py``)."""
        session = self._session
        if session is None:
            raise TrainerStateError("RayPPOTrainer: a run state belongs to a detached run")
        pending, sync, pipeline = self._pending_save, self._weight_sync, self._async
        async_state = None
        if pipeline is not None:
            launched = pipeline.launched_step()
            async_state = AsyncState(
                dict(pipeline.actor_version_of),
                pipeline.rollout_actor_version,
                launched,
                None if launched is None else session.launched.get(launched),
            )
        return RunState(
            run_id=session.run_id,
            step=step,
            scope=scope,
            global_step=self.global_step,
            recoveries=self.recoveries,
            pending_save_step=None if pending is None else pending.step,
            pending_save_state=None if pending is None else pending.state,
            weight_sync_version=None if sync is None else sync.version,
            async_state=async_state,
            recovering=recovering,
        )

    def _take_over(self, state: RunState) -> None:
        """Continue where the previous driver of this detached run was when ``state`` was
        written: its step and call scope, metrics, pending checkpoint and versions."""
        session = self._session
        if session is None:
            raise TrainerStateError("RayPPOTrainer: only a detached run is taken over")
        self.global_step = state.global_step
        self.recoveries = state.recoveries
        records = read_metrics(self.output.metrics_path)
        self.history = [r for r in records if r["step"] <= state.global_step]
        self.output.start(self.history)
        if state.pending_save_step is not None and state.pending_save_state is not None:
            saved = [r for r in self.history if r["step"] <= state.pending_save_step]
            self._pending_save = PendingSave(
                state.pending_save_step, state.pending_save_state, saved
            )
        if self._weight_sync is not None and state.weight_sync_version is not None:
            self._weight_sync.version = state.weight_sync_version
        if self._async is not None and state.async_state is not None:
            pipeline = state.async_state
            self._async.restore(pipeline.actor_version_of, pipeline.rollout_actor_version)
        session.replay_from(state)
        logger.warning(
            "run %s: re-attached at step %d (call scope %d, %d steps done)",
            session.run_id,
            state.step,
            state.scope,
            state.global_step,
        )

    def _any_dead(self) -> bool:
        return any(group.dead_ranks for group in self._workers("fit").owned)

    def detach(self) -> None:
        """Forget the worker groups without stopping them: a detached run's driver that
        stops leaves its workers to the next driver (the driver-side threads end)."""
        for part in (self._async, self._agents, self._servers):
            if part is not None:
                part.close()
        self._async = self._agents = self._servers = None
        self._weight_sync = None
        self._groups = None

    def _inject_fault(self, step: int) -> None:
        """Inject the faults of ``config.inject_fault`` whose step begins (each once)."""
        if any(f.step == step for f in self._faults):
            self._faults = inject_due(self._workers("inject_fault"), self._faults, step)

    def _recover(self, step: int, error: BaseException | None) -> dict[str, Any]:
        """Bring the workers back after ``error`` (a death during ``step``) and restore the
        newest complete checkpoint (``fit`` saved one before its first step; see
        ``_recovery.py``); returns the ``recovery/*`` metrics. Raises
        :class:`TrainerRecoveryError` (from ``error``) when the run may not recover
        (``max_recoveries`` reached, or no checkpoint left), and ``error`` itself when no
        worker died. ``error=None``: a re-attached driver found a worker dead (it died while
        no driver was attached), or its predecessor died recovering; it recovers anyway."""
        done, limit = self.recoveries, self.config.max_recoveries
        what = "a worker died while no driver was attached" if error is None else str(error)
        if done >= limit:
            raise TrainerRecoveryError(
                f"step {step}: {what}; the run already recovered {done} times "
                f"(max_recoveries={limit})"
            ) from error
        started = time.perf_counter()
        with driver_span("trainer", "recovery"):
            groups = self._workers("recover")
            if error is not None and not wait_for_dead(groups.owned):
                raise error  # every worker is alive: not a death, nothing to recover from
            self._begin_step(step, recovering=True)  # a detached run: redo it if we die
            self._settle_pending_save()  # complete on disk, or abandoned
            latest = latest_checkpoint(self.output.checkpoint_root)
            if latest is None:  # fit saves one before the first step; someone removed it
                raise TrainerRecoveryError(
                    f"step {step}: {what}, and {self.output.checkpoint_root} holds no complete "
                    "checkpoint to recover from"
                ) from error
            replaced = replace_dead(groups.owned)
            self._init_models()  # builds what the re-formed groups dropped; the rest keep theirs
            self._load_checkpoint(latest)
            self._resync_rollout()
        seconds = time.perf_counter() - started
        self.recoveries = done + 1
        logger.warning(
            "step %d: %s; replaced %s and restored %s in %.1f s (recovery %d of at most %d)",
            step,
            what,
            replaced,
            latest.name,
            seconds,
            done + 1,
            limit,
        )
        return {
            "recovery/count": done + 1,
            "recovery/seconds": seconds,
            "recovery/from_step": self.global_step,
            "recovery/failed_step": step,
        }

    def _resync_rollout(self) -> None:
        """After a recovery: a separately placed rollout gets the restored weights over a
        fresh channel."""
        if self._weight_sync is not None:
            self._weight_sync.reset()
            self._sync_weights({}, self.global_step)

    def _validates(self, step: int) -> bool:
        """Whether the run validates after ``step``."""
        return step % self.config.val_every == 0 or step == self.config.steps

    def _log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        self.output.log_metrics(record)
        logger.info("step %s %s", record.get("step"), json.dumps(record, default=str))

    # ------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        """Worker state (per rank), trainer state and the metrics so far, in
        ``checkpoint_dir(global_step)``; returns that folder.

        With ``config.background_checkpoints`` the workers copy their state and return, and
        write it while training goes on; the checkpoint becomes complete (trainer state,
        ``latest``) when :meth:`_finish_save` finds them done, at the end of a later step or
        of :meth:`fit`. Before that a recovery or a resume does not see it."""
        self._finish_save(block=True)  # one save at a time
        step = self.global_step
        self._driver_fault(step, "save_checkpoint")
        folder = self.output.checkpoint_dir(step)
        folder.mkdir(parents=True, exist_ok=True)
        background = self.config.background_checkpoints
        self.actor_rollout_wg.save_checkpoint(
            str(folder / "actor"), global_step=step, background=background
        )
        if self.use_critic:
            self.critic_wg.save_checkpoint(
                str(folder / "critic"), global_step=step, background=background
            )
        state = {"global_step": step, "config": asdict(self.config)}
        self._pending_save = PendingSave(step, state, list(self.history))
        if not background:
            self._finish_save(block=True)
        return folder

    def _finish_save(self, block: bool) -> Path | None:
        """Complete the pending checkpoint if its workers are done writing (``block``: wait
        for them); then keep only the newest ``config.keep_checkpoints``. Returns the
        completed folder, or ``None`` when none was completed."""
        pending = self._pending_save
        if pending is None:
            return None
        timeout = None if block else 0.0
        # every group is asked (each rank answers whether its part is written)
        done = self.actor_rollout_wg.wait_checkpoint(timeout=timeout)
        if self.use_critic:
            done = done + self.critic_wg.wait_checkpoint(timeout=timeout)
        if not all(done):
            return None
        self._pending_save = None
        return self._complete_save(pending)

    def _complete_save(self, pending: PendingSave) -> Path:
        return self.output.complete_save(pending, self.config.keep_checkpoints)

    def _settle_pending_save(self) -> None:
        """In a recovery: complete the pending checkpoint if every role published it on
        disk, else abandon it (:meth:`RunOutput.settle_save`)."""
        pending, self._pending_save = self._pending_save, None
        if pending is not None:
            roles = ["actor", "critic"] if self.use_critic else ["actor"]
            self.output.settle_save(pending, roles, self.config.keep_checkpoints)

    def _load_checkpoint(self, folder: Path) -> None:
        step = check_resumable(folder, self.config)
        self.actor_rollout_wg.load_checkpoint(str(folder / "actor"))
        if self.use_critic:
            self.critic_wg.load_checkpoint(str(folder / "critic"))
        self.global_step = step
        self.history = [r for r in read_metrics(folder / "metrics.jsonl") if r["step"] <= step]
        self.output.start(self.history)
        logger.info("resumed from %s at step %d", folder, step)
