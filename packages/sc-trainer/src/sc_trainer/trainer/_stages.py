"""The stages of one training step that run on the driver (balancing, reward, advantages),
the checks of what workers return, and the per-stage timer: plain functions of a batch, so
that the trainer's loop (``_trainer.py``) reads as its dataflow."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from sc_protocol import DataProto
from sc_workers.algos import (
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_rollout_correction,
    masked_mean,
    rollout_mismatch_metrics,
)

from .._errors import ExactModeMismatchError, TrainingDivergedError, WorkerOutputError
from ..config import RolloutCorrectionConfig, TrainerConfig
from ..tasks import Task
from ._balance import balanced_order, shard_token_sums

__all__ = [
    "StageTimer",
    "TIMING_PREFIXES",
    "apply_rollout_correction",
    "balance_batch",
    "check_finite",
    "compute_advantage",
    "compute_reward",
    "log_prob_gap",
    "metrics_of",
    "response_metrics",
    "rollout_mismatch",
    "tensors_for",
]

#: Metric keys that depend on wall time; everything else is a function of the seed.
TIMING_PREFIXES = ("timing/", "perf/")


class StageTimer:
    """``with timer("generate"): ...`` records the seconds of each stage of one step;
    ``around(stage)`` is a context the stage runs in (the trainer's injected driver faults)."""

    def __init__(
        self, around: Callable[[str], contextlib.AbstractContextManager[None]] | None = None
    ) -> None:
        self.seconds: dict[str, float] = {}
        self._around = around

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        around = contextlib.nullcontext() if self._around is None else self._around(stage)
        with around:
            start = time.perf_counter()
            try:
                yield
            finally:
                elapsed = time.perf_counter() - start
                self.seconds[stage] = self.seconds.get(stage, 0.0) + elapsed


def balance_batch(batch: DataProto, dp_size: int, metrics: dict[str, Any]) -> DataProto:
    """Reorder rows so every dp shard holds a similar number of tokens."""
    counts = tensors_for(batch, "balance")["attention_mask"].sum(dim=-1).tolist()
    order = balanced_order(counts, dp_size)
    sums = shard_token_sums([counts[i] for i in order], dp_size)
    metrics["balance/max_over_mean_tokens"] = max(sums) / (sum(sums) / len(sums))
    batch.reorder(torch.tensor(order))
    return batch


def compute_reward(task: Task, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
    """The task's verifiable reward of each response token (``task.score_batch``: the digit
    task credits each right position; an agent task pays each session's reward on its last
    model token)."""
    td = tensors_for(batch, "reward")
    mask = td["response_mask"]
    token_scores, reward_metrics = task.score_batch(batch)
    metrics.update(reward_metrics)
    td["token_level_scores"] = token_scores
    td["token_level_rewards"] = token_scores  # the KL term is a loss of the actor
    scores = token_scores.sum(dim=-1)
    metrics["train/reward"] = scores.mean().item()
    metrics["train/reward_std"] = scores.std().item() if len(scores) > 1 else 0.0
    metrics["train/response_length"] = mask.sum(dim=-1).float().mean().item()
    return batch


def response_metrics(batch: DataProto, metrics: dict[str, Any]) -> None:
    """What users read first about a step's responses: their length in tokens (mean, max,
    and the share that reached the response length, ``clip_ratio``), and the tokens of the
    batch (``perf/tokens``: prompts and responses, for the step's throughput)."""
    td = tensors_for(batch, "reward")
    lengths = td["response_mask"].sum(dim=-1).float()
    width = td["responses"].shape[-1]
    metrics["response_length/mean"] = lengths.mean().item()
    metrics["response_length/max"] = lengths.max().item()
    metrics["response_length/clip_ratio"] = (lengths >= width).float().mean().item()
    mask = td["attention_mask"] if "attention_mask" in td else td["response_mask"]
    metrics["perf/tokens"] = int(mask.sum().item())


def compute_advantage(
    batch: DataProto, metrics: dict[str, Any], config: TrainerConfig, use_critic: bool
) -> DataProto:
    """GAE from the critic's values (PPO), or group-normalised scores (GRPO)."""
    td = tensors_for(batch, "advantages")
    rewards, mask = td["token_level_rewards"], td["response_mask"]
    if use_critic:
        advantages, returns = compute_gae_advantage_return(
            token_level_rewards=rewards,
            values=td["values"],
            response_mask=mask,
            gamma=config.gamma,
            lam=config.lam,
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


_NEEDED = {
    "balance": ("attention_mask",),
    "reward": ("responses", "response_mask"),
    "advantages": ("token_level_rewards", "response_mask", "old_log_probs", "ref_log_prob"),
    "validate": ("responses", "response_mask"),
    "off_policy": ("rollout_log_probs",),
    "rollout_correction": ("old_log_probs", "rollout_log_probs", "response_mask"),
    "exact_check": ("old_log_probs", "rollout_log_probs", "response_mask", "responses"),
}


def tensors_for(batch: DataProto, stage: str) -> Any:
    """The tensor columns of ``batch`` (a TensorDict), checked for what ``stage`` reads."""
    td = batch.batch
    missing = [k for k in _NEEDED[stage] if td is None or k not in td]
    if td is None or missing:
        have = [] if td is None else sorted(td.keys())
        raise WorkerOutputError(f"RayPPOTrainer.{stage}: the batch lacks {missing} (has {have})")
    return td


def _mismatch(batch: DataProto, bounds: tuple[float, float]) -> dict[str, float]:
    """``rollout_mismatch_metrics`` of the batch, plus ``rollout/log_prob_diff_mean|max``
    (the same absolute differences under their older names); ``{}`` without both the
    sampler's and the actor's log-probs, or without response tokens."""
    td = batch.batch
    if td is None or "rollout_log_probs" not in td or "old_log_probs" not in td:
        return {}
    found = rollout_mismatch_metrics(
        td["old_log_probs"], td["rollout_log_probs"], td["response_mask"], bounds
    )
    if found:
        found["rollout/log_prob_diff_mean"] = found["rollout_corr/log_prob_abs_diff_mean"]
        found["rollout/log_prob_diff_max"] = found["rollout_corr/log_prob_abs_diff_max"]
        found.update(_mismatch_by_span(batch, bounds))
    return found


#: the mismatch metrics reported per weight-version span as well
_SPAN_KEYS = ("log_prob_abs_diff_mean", "log_prob_abs_diff_max", "k3_kl")


def _mismatch_by_span(batch: DataProto, bounds: tuple[float, float]) -> dict[str, float]:
    """The mismatch of the rows grouped by how many weight syncs each spans (``k`` =
    ``weight_version_max - weight_version_min``: 0 for a row sampled by one version, 1 for a
    partial rollout resumed across one sync): ``rollout_corr/span<k>/<metric>`` for the
    metrics of :data:`_SPAN_KEYS` and ``rollout_corr/span<k>/rows_fraction``; ``{}`` for a
    batch without the two columns (worker-group rollouts)."""
    low = batch.non_tensor_batch.get("weight_version_min")
    high = batch.non_tensor_batch.get("weight_version_max")
    td = batch.batch
    if low is None or high is None or td is None:
        return {}
    spans = np.asarray(high, dtype=np.int64) - np.asarray(low, dtype=np.int64)
    out: dict[str, float] = {}
    for span in sorted({int(s) for s in spans}):
        rows = torch.from_numpy(spans == span)
        found = rollout_mismatch_metrics(
            td["old_log_probs"][rows],
            td["rollout_log_probs"][rows],
            td["response_mask"][rows],
            bounds,
        )
        for key in _SPAN_KEYS:
            if f"rollout_corr/{key}" in found:
                out[f"rollout_corr/span{span}/{key}"] = found[f"rollout_corr/{key}"]
        out[f"rollout_corr/span{span}/rows_fraction"] = float(rows.float().mean())
    return out


def log_prob_gap(batch: DataProto, metrics: dict[str, Any]) -> None:
    """How far the sampler's log-probs (``rollout_log_probs``) are from the actor's own
    (``old_log_probs``) on the response tokens: ``rollout/log_prob_diff_mean`` and ``_max``
    (absolute, in nats). Near zero when the rollout samples the actor's policy; a gap means
    the rollout's weights or numerics differ from the actor's. :func:`rollout_mismatch`
    writes these too, with the rest of the mismatch metrics."""
    found = _mismatch(batch, RolloutCorrectionConfig().bounds)
    metrics.update({k: v for k, v in found.items() if k.startswith("rollout/")})


def rollout_mismatch(
    batch: DataProto, metrics: dict[str, Any], config: RolloutCorrectionConfig
) -> None:
    """The ``rollout_corr/*`` mismatch metrics of the batch (sc_workers.algos'
    ``rollout_mismatch_metrics``: KL estimates, sequence log-ratios, out-of-bounds fractions
    for ``config.bounds``) and ``rollout/log_prob_diff_mean|max``, when it has both the
    sampler's and the actor's log-probs."""
    metrics.update(_mismatch(batch, config.bounds))


def check_exact(batch: DataProto, step: int) -> None:
    """The exact mode's check (``exact_check``): every response token's log-prob as the
    sampler reported it (``rollout_log_probs``) equals the actor's recomputation
    (``old_log_probs``) bit for bit, else :class:`ExactModeMismatchError` naming the first
    token that differs (row-major), both values and how many differ."""
    td = tensors_for(batch, "exact_check")
    sampled, actor = td["rollout_log_probs"], td["old_log_probs"]
    differs = (sampled != actor) & td["response_mask"].bool()
    count = int(differs.sum())
    if not count:
        return
    row, position = (int(i) for i in differs.nonzero()[0])
    token = int(td["responses"][row, position])
    a, b = float(sampled[row, position]), float(actor[row, position])
    raise ExactModeMismatchError(
        f"RayPPOTrainer step {step}: response token {position} of row {row} (token id "
        f"{token}) was sampled with log-prob {a!r}, the actor computes {b!r} (difference "
        f"{a - b:.3g}); {count} of {int(td['response_mask'].sum())} response tokens differ. "
        "The exact mode (exact_window) makes them equal on one device type and dtype: do the "
        "sampler and the actor run the same weights, dtype and exact_window?"
    )


def apply_rollout_correction(
    batch: DataProto, config: RolloutCorrectionConfig, metrics: dict[str, Any]
) -> DataProto:
    """The batch the actor's update takes: with ``config.rollout_is``, a ``rollout_is_weights``
    column (the truncated importance weights the policy loss multiplies by); with
    ``config.rollout_rs``, ``response_mask`` with the rejected tokens zeroed. Unchanged when
    the correction is off. Runs after the advantages and the critic's update, which keep the
    full mask."""
    if not config.enabled:
        return batch
    td = tensors_for(batch, "rollout_correction")
    lower, upper = config.bounds
    corr = compute_rollout_correction(
        td["old_log_probs"],
        td["rollout_log_probs"],
        td["response_mask"],
        rollout_is=config.rollout_is,
        rollout_is_threshold=config.rollout_is_threshold,
        rollout_rs=config.rollout_rs,
        rollout_rs_threshold=upper,
        rollout_rs_threshold_lower=lower,
    )
    if corr.rollout_is_weights is not None:
        td["rollout_is_weights"] = corr.rollout_is_weights
    td["response_mask"] = corr.response_mask
    metrics.update(corr.metrics)
    return batch


def metrics_of(out: DataProto) -> dict[str, float]:
    """The metrics a worker update returned in ``meta_info["metrics"]``: joining the ranks'
    outputs gathers each metric into a list of the ranks' values (verl's rule); the values
    are dp-reduced already, so their mean is the value."""
    metrics: dict[str, Any] = out.meta_info.get("metrics", {})
    return {
        key: float(np.mean(value)) if isinstance(value, list) else float(value)
        for key, value in metrics.items()
    }


def check_finite(step: int, metrics: Mapping[str, Any]) -> None:
    bad = {
        k: v
        for k, v in metrics.items()
        if isinstance(v, float) and not math.isfinite(v) and not k.startswith(TIMING_PREFIXES)
    }
    if bad:
        raise TrainingDivergedError(f"RayPPOTrainer.fit: step {step} has non-finite metrics {bad}")
