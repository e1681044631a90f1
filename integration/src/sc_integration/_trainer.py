"""The reference PPO/GRPO trainer, in the single-controller style.

:class:`TaskRunner` maps roles to worker classes and resource pools and builds a
:class:`RayPPOTrainer`; ``init_workers`` turns the roles into worker groups (actor, rollout
and reference colocated in one process per rank, the critic with them or in a pool of its
own); ``fit`` is the training loop, written as plain sequential Python on the driver.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sc_core import SpanRecorder
from sc_protocol import DataProto
from sc_workers import (
    ActorConfig,
    ActorRolloutRefConfig,
    ActorRolloutRefWorker,
    CriticConfig,
    CriticWorker,
    ModelConfig,
    OptimConfig,
    RefConfig,
    RolloutConfig,
)
from sc_workers.algos import (
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    masked_mean,
)

from ._backends import WorkerBackend, make_backend
from ._balance import balanced_order, shard_token_sums
from ._config import TrainerConfig
from ._errors import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    TrainingDivergedError,
    WorkerOutputError,
)
from ._output import TRAINER_STATE, RunOutput, read_metrics, resolve_checkpoint
from ._task import DigitsTask

__all__ = ["RayPPOTrainer", "Role", "RunResult", "TaskRunner"]

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int, Mapping[str, Any]], None]

#: Metric keys that depend on wall time; everything else is a function of the seed.
TIMING_PREFIXES = ("timing/", "perf/")


class Role(enum.Enum):
    """The roles of the RL dataflow that this trainer places (verl's names)."""

    ActorRolloutRef = "actor_rollout_ref"
    Critic = "critic"


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


class _StageTimer:
    """``with timer("generate"): ...`` records the seconds of each stage of one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start


def _worker_configs(
    config: TrainerConfig, task: DigitsTask, dp_size: int
) -> tuple[ActorRolloutRefConfig, CriticConfig]:
    """The sc-workers configuration of the actor/rollout/ref and critic workers."""
    tok = task.tokenizer
    model = ModelConfig(
        vocab_size=tok.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=4 * config.hidden_size,
        max_position_embeddings=task.prompt_length + task.response_length,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        seed=config.seed,
    )
    n = config.responses_per_prompt
    mini_prompts = config.prompts_per_step // config.ppo_mini_batches
    micro = mini_prompts * n // dp_size  # one micro-batch per mini-batch: tiny model, few rows
    rows_per_rank = config.rows_per_step // dp_size
    actor_rollout_ref = ActorRolloutRefConfig(
        model=model,
        actor=ActorConfig(
            ppo_mini_batch_size=mini_prompts,
            ppo_micro_batch_size_per_gpu=micro,
            ppo_epochs=config.ppo_epochs,
            clip_ratio=config.clip_ratio,
            entropy_coeff=config.entropy_coeff,
            use_kl_loss=config.kl_coef > 0,
            kl_loss_coef=config.kl_coef,
            kl_loss_type="low_var_kl",
            data_loader_seed=config.seed,
            optim=OptimConfig(lr=config.actor_lr, weight_decay=0.0),
        ),
        rollout=RolloutConfig(
            temperature=config.temperature,
            response_length=task.response_length,
            n=n,
            log_prob_micro_batch_size_per_gpu=rows_per_rank,
            seed=config.seed,
        ),
        ref=RefConfig(log_prob_micro_batch_size_per_gpu=rows_per_rank),
        device="cpu",
    )
    critic = CriticConfig(
        model=model,
        ppo_mini_batch_size=mini_prompts,
        ppo_micro_batch_size_per_gpu=micro,
        forward_micro_batch_size_per_gpu=rows_per_rank,
        ppo_epochs=config.ppo_epochs,
        rollout_n=n,
        data_loader_seed=config.seed,
        optim=OptimConfig(lr=config.critic_lr, weight_decay=0.0),
        device="cpu",
    )
    return actor_rollout_ref, critic


class RayPPOTrainer:
    """The PPO/GRPO loop on the driver; every stage is one call on a worker group.

    The name is verl's; ``backend`` decides whether the worker groups are Ray actors or
    objects in this process, the loop is the same.
    """

    def __init__(
        self,
        config: TrainerConfig,
        task: DigitsTask,
        role_worker_mapping: Mapping[Role, type],
        resource_pool_manager: Any,
        backend: WorkerBackend,
        output: RunOutput,
    ) -> None:
        self.config = config
        self.task = task
        self.role_worker_mapping = dict(role_worker_mapping)
        self.resource_pool_manager = resource_pool_manager
        self.backend = backend
        self.output = output
        self.use_critic = Role.Critic in self.role_worker_mapping
        self.dp_size = config.workers_per_role
        self.actor_rollout_ref_config, self.critic_config = _worker_configs(
            config, task, self.dp_size
        )
        self.global_step = 0
        self.history: list[dict[str, Any]] = []
        self.actor_rollout_wg: Any = None
        self.ref_policy_wg: Any = None
        self.critic_wg: Any = None
        self._owned_groups: list[Any] = []

    # ----------------------------------------------------------------- workers
    def init_workers(self) -> None:
        """Create the resource pools, then one worker group per role.

        The actor, its rollout and the reference model are one worker (role
        ``actor_rollout_ref``), so they share a process per rank. Roles that share a pool
        (the critic with ``colocate``) are fused into one class with
        ``create_colocated_worker_cls``; ``spawn`` then gives one worker group per role over
        the same processes.
        """
        self.resource_pool_manager.create_resource_pool()
        pool_to_classes: dict[Any, dict[str, Any]] = {}
        role_kwargs: dict[Role, tuple[str, dict[str, Any]]] = {
            Role.ActorRolloutRef: (
                "actor_rollout",
                {"config": self.actor_rollout_ref_config, "role": "actor_rollout_ref"},
            ),
            Role.Critic: ("critic", {"config": self.critic_config}),
        }
        for role, worker_cls in self.role_worker_mapping.items():
            prefix, kwargs = role_kwargs[role]
            pool = self.resource_pool_manager.get_resource_pool(role)
            pool_to_classes.setdefault(pool, {})[prefix] = self.backend.class_with_init(
                worker_cls, **kwargs
            )
        all_wg: dict[str, Any] = {}
        for pool, class_dict in pool_to_classes.items():
            if len(class_dict) == 1:
                ((prefix, cls_with_init),) = class_dict.items()
                all_wg[prefix] = self._own(self.backend.worker_group(pool, cls_with_init))
            else:
                colocated = self.backend.create_colocated_worker_cls(class_dict)
                wg_dict = self._own(self.backend.worker_group(pool, colocated))
                all_wg.update(wg_dict.spawn(prefix_set=class_dict.keys()))
        self.actor_rollout_wg = all_wg["actor_rollout"]
        self.ref_policy_wg = self.actor_rollout_wg  # the reference lives in the actor process
        self.actor_rollout_wg.init_model()
        if self.use_critic:
            self.critic_wg = all_wg["critic"]
            self.critic_wg.init_model()

    def _own(self, group: Any) -> Any:
        """Keep ``group`` (it owns workers that spawned groups use) until :meth:`close`."""
        self._owned_groups.append(group)
        return group

    def close(self) -> None:
        """Stop every worker (spawned role groups share the workers of the groups owned here)."""
        while self._owned_groups:
            self.backend.close_group(self._owned_groups.pop())

    # -------------------------------------------------------------------- data
    def _prompt_batch(self, texts: np.ndarray, uid_prefix: str, meta: dict[str, Any]) -> DataProto:
        tensors = self.task.encode_prompts(texts)
        uids = np.array([f"{uid_prefix}-{i}" for i in range(len(texts))], dtype=object)
        return DataProto.from_dict(
            tensors=tensors,
            non_tensors={"prompt_text": np.asarray(texts, dtype=object), "uid": uids},
            meta_info=meta,
        )

    def _train_batch(self, step: int) -> DataProto:
        texts = self.task.sample_train(self.config.prompts_per_step, self.config.seed, step)
        batch = self._prompt_batch(texts, f"s{step}", {"global_step": step})
        return batch.repeat(repeat_times=self.config.responses_per_prompt, interleave=True)

    # ------------------------------------------------------------------ stages
    def _balance_batch(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Reorder rows so every dp shard holds a similar number of tokens."""
        counts = _tensors(batch, "balance")["attention_mask"].sum(dim=-1).tolist()
        order = balanced_order(counts, self.dp_size)
        sums = shard_token_sums([counts[i] for i in order], self.dp_size)
        metrics["balance/max_over_mean_tokens"] = max(sums) / (sum(sums) / len(sums))
        batch.reorder(torch.tensor(order))
        return batch

    def _compute_reward(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """The verifiable reward: each response token earns its position's credit."""
        td = _tensors(batch, "reward")
        mask = td["response_mask"]
        token_scores = self.task.token_scores(
            batch.non_tensor_batch["prompt_text"], td["responses"], mask
        )
        td["token_level_scores"] = token_scores
        td["token_level_rewards"] = token_scores  # the KL term is a loss of the actor
        scores = token_scores.sum(dim=-1)
        metrics["train/reward"] = scores.mean().item()
        metrics["train/reward_std"] = scores.std().item() if len(scores) > 1 else 0.0
        metrics["train/response_length"] = mask.sum(dim=-1).float().mean().item()
        return batch

    def _compute_advantage(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """GAE from the critic's values (PPO), or group-normalised scores (GRPO)."""
        td = _tensors(batch, "advantages")
        rewards, mask = td["token_level_rewards"], td["response_mask"]
        if self.use_critic:
            advantages, returns = compute_gae_advantage_return(
                token_level_rewards=rewards,
                values=td["values"],
                response_mask=mask,
                gamma=self.config.gamma,
                lam=self.config.lam,
            )
        else:
            advantages, returns = compute_grpo_outcome_advantage(
                token_level_rewards=rewards,
                response_mask=mask,
                index=batch.non_tensor_batch["uid"],
            )
        td["advantages"] = advantages
        td["returns"] = returns
        kl = td["old_log_probs"] - td["ref_log_prob"]
        metrics["actor/kl_ref"] = masked_mean(kl, mask).item()
        return batch

    # -------------------------------------------------------------------- loop
    def _train_step(self, step: int) -> dict[str, Any]:
        """One PPO/GRPO step; each line is one stage of the dataflow."""
        m: dict[str, Any] = {"step": step}
        t = _StageTimer()
        batch = self._train_batch(step)
        with t("generate"):  # prompts in, prompts + responses out (non-tensor columns kept)
            batch = self.actor_rollout_wg.generate_sequences(batch)
        with t("balance"):
            batch = self._balance_batch(batch, m)
        with t("reward"):
            batch = self._compute_reward(batch, m)
        with t("old_log_prob"):
            batch = batch.union(self.actor_rollout_wg.compute_log_prob(batch))
        with t("ref_log_prob"):
            batch = batch.union(self.ref_policy_wg.compute_ref_log_prob(batch))
        if self.use_critic:
            with t("values"):
                batch = batch.union(self.critic_wg.compute_values(batch))
        with t("advantages"):
            batch = self._compute_advantage(batch, m)
        if self.use_critic:
            with t("update_critic"):
                m.update(_metrics_of(self.critic_wg.update_critic(batch)))
        with t("update_actor"):
            m.update(_metrics_of(self.actor_rollout_wg.update_actor(batch)))
        m.update({f"timing/{k}": v for k, v in t.seconds.items()})
        m["perf/step_time_s"] = sum(t.seconds.values())
        _check_finite(step, m)
        return m

    def validate(self) -> float:
        """Mean reward of greedy responses to the held-out prompts."""
        texts = self.task.val_strings
        batch = self._prompt_batch(texts, "val", {"do_sample": False})
        pad = (-len(batch)) % self.dp_size
        if pad:
            batch = DataProto.concat([batch, batch[:pad]])
        td = _tensors(self.actor_rollout_wg.generate_sequences(batch), "validate")
        n = len(texts)
        scores = self.task.score(texts, td["responses"][:n], td["response_mask"][:n])
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
        if resume_from is not None:
            self._load_checkpoint(resume_from)
        else:
            self.output.start()
        if on_start is not None:
            on_start(self.global_step)
        if not any("val/reward" in r for r in self.history):
            record = {"step": self.global_step, "val/reward": self.validate()}
            self._log(record)
        while self.global_step < cfg.steps:
            step = self.global_step + 1
            metrics = self._train_step(step)
            self.global_step = step
            if step % cfg.val_every == 0 or step == cfg.steps:
                metrics["val/reward"] = self.validate()
            self._log(metrics)
            if progress is not None:
                progress(step, metrics)
            if step % cfg.save_every == 0 or step == cfg.steps:
                self.save_checkpoint()
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

    def _log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        self.output.log_metrics(record)
        logger.info("step %s %s", record.get("step"), json.dumps(record, default=str))

    # ------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        """Worker state (per rank), trainer state and the metrics so far."""
        folder = self.output.checkpoint_dir(self.global_step)
        folder.mkdir(parents=True, exist_ok=True)
        self.actor_rollout_wg.save_checkpoint(str(folder / "actor"), global_step=self.global_step)
        if self.use_critic:
            self.critic_wg.save_checkpoint(str(folder / "critic"), global_step=self.global_step)
        state = {"global_step": self.global_step, "config": asdict(self.config)}
        return self.output.finish_checkpoint(self.global_step, state)

    def _load_checkpoint(self, folder: Path) -> None:
        step = check_resumable(folder, self.config)
        self.actor_rollout_wg.load_checkpoint(str(folder / "actor"))
        if self.use_critic:
            self.critic_wg.load_checkpoint(str(folder / "critic"))
        self.global_step = step
        self.history = [r for r in read_metrics(folder / "metrics.jsonl") if r["step"] <= step]
        self.output.start(self.history)
        logger.info("resumed from %s at step %d", folder, step)


#: Settings a resumed run must share with the run that wrote the checkpoint (the worker
#: state is sharded per rank and shaped by the model and task).
_RESUME_KEYS = (
    "algorithm",
    "workers_per_role",
    "nnodes",
    "hidden_size",
    "num_layers",
    "num_heads",
    "task",
)


def check_resumable(folder: Path, config: TrainerConfig) -> int:
    """The step the checkpoint in ``folder`` was taken at, if ``config`` can resume from it."""
    try:
        state = json.loads((folder / TRAINER_STATE).read_text(encoding="utf-8"))
        step = int(state["global_step"])
        saved = dict(state["config"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointNotFoundError(
            f"resume: cannot read {folder / TRAINER_STATE}: {err}"
        ) from err
    now = asdict(config)
    differ = {k: (saved.get(k), now[k]) for k in _RESUME_KEYS if saved.get(k) != now[k]}
    if differ:
        detail = ", ".join(f"{k}: checkpoint {a!r}, this run {b!r}" for k, (a, b) in differ.items())
        raise CheckpointMismatchError(f"resume: {folder} does not fit this run ({detail})")
    if step >= config.steps:
        raise CheckpointMismatchError(
            f"resume: {folder} is at step {step}; ask for more steps than that, got "
            f"steps={config.steps}"
        )
    return step


_NEEDED = {
    "balance": ("attention_mask",),
    "reward": ("responses", "response_mask"),
    "advantages": ("token_level_rewards", "response_mask", "old_log_probs", "ref_log_prob"),
    "validate": ("responses", "response_mask"),
}


def _tensors(batch: DataProto, stage: str) -> Any:
    """The tensor columns of ``batch`` (a TensorDict), checked for what ``stage`` reads."""
    td = batch.batch
    missing = [k for k in _NEEDED[stage] if td is None or k not in td]
    if td is None or missing:
        have = [] if td is None else sorted(td.keys())
        raise WorkerOutputError(f"RayPPOTrainer.{stage}: the batch lacks {missing} (has {have})")
    return td


def _metrics_of(out: DataProto) -> dict[str, float]:
    """The metrics a worker update returned in ``meta_info["metrics"]``: joining the ranks'
    outputs gathers each metric into a list of the ranks' values (verl's rule); the values
    are dp-reduced already, so their mean is the value."""
    metrics: dict[str, Any] = out.meta_info.get("metrics", {})
    return {
        key: float(np.mean(value)) if isinstance(value, list) else float(value)
        for key, value in metrics.items()
    }


def _check_finite(step: int, metrics: Mapping[str, Any]) -> None:
    bad = {
        k: v
        for k, v in metrics.items()
        if isinstance(v, float) and not math.isfinite(v) and not k.startswith(TIMING_PREFIXES)
    }
    if bad:
        raise TrainingDivergedError(f"RayPPOTrainer.fit: step {step} has non-finite metrics {bad}")


class TaskRunner:
    """Assembles a run: roles → worker classes, roles → resource pools, then train.

    ``run`` starts the backend (a local Ray cluster for ``backend="ray"``), builds the
    trainer, calls ``init_workers`` and ``fit``, writes the plot and the trace, and stops the
    backend again.
    """

    def __init__(self, config: TrainerConfig) -> None:
        self.config = config

    def role_worker_mapping(self) -> dict[Role, type]:
        mapping: dict[Role, type] = {Role.ActorRolloutRef: ActorRolloutRefWorker}
        if self.config.uses_critic:
            mapping[Role.Critic] = CriticWorker
        return mapping

    def resource_pool_spec(self) -> tuple[dict[str, list[int]], dict[Role, str]]:
        """Pools (processes per node) and the pool of each role."""
        cfg = self.config
        per_node = [cfg.workers_per_role // cfg.nnodes] * cfg.nnodes
        spec = {"global_pool": per_node}
        mapping = {Role.ActorRolloutRef: "global_pool"}
        if self.config.uses_critic:
            if self.config.colocate:
                mapping[Role.Critic] = "global_pool"
            else:
                spec["critic_pool"] = list(per_node)
                mapping[Role.Critic] = "critic_pool"
        return spec, mapping

    def build_trainer(self, backend: WorkerBackend) -> RayPPOTrainer:
        """The trainer of this run on ``backend``; its workers start in ``init_workers``."""
        cfg = self.config
        spec, mapping = self.resource_pool_spec()
        return RayPPOTrainer(
            cfg,
            DigitsTask(cfg.task),
            self.role_worker_mapping(),
            backend.resource_pool_manager(spec, mapping),
            backend,
            RunOutput(cfg.output_dir),
        )

    def run(
        self, progress: ProgressFn | None = None, on_start: Callable[[int], None] | None = None
    ) -> RunResult:
        """Train as configured; ``progress(step, metrics)`` after every step."""
        cfg = self.config
        resume = None if cfg.resume_from is None else resolve_checkpoint(cfg.resume_from)
        if resume is not None:
            check_resumable(resume, cfg)  # before any worker starts
        backend = make_backend(cfg)
        recorder = SpanRecorder()
        with backend.running(), recorder:
            trainer = self.build_trainer(backend)
            try:
                trainer.init_workers()
                result = trainer.fit(progress=progress, on_start=on_start, resume_from=resume)
            finally:
                trainer.close()
                recorder.write_chrome_trace(trainer.output.trace_path)
        trainer.output.write_plot(result.history)
        return result
