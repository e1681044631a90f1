"""RL math: advantage estimators, PPO losses, KL penalties, masked statistics and the
rollout-training mismatch (metrics and corrections)."""

from sc_dispatch import _public

from ._core import (
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    agg_loss_denominator,
    ban_logits_,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_policy_loss,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_value_loss,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from ._rollout_corr import (
    ROLLOUT_IS_MODES,
    ROLLOUT_RS_MODES,
    SAFETY_BOUND,
    RolloutCorrection,
    check_rollout_correction,
    compute_rollout_correction,
    rollout_mismatch_metrics,
)

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "ROLLOUT_IS_MODES",
    "ROLLOUT_RS_MODES",
    "RolloutCorrection",
    "SAFETY_BOUND",
    "agg_loss",
    "agg_loss_denominator",
    "ban_logits_",
    "check_rollout_correction",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_policy_loss",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rollout_correction",
    "compute_value_loss",
    "entropy_from_logits",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "rollout_mismatch_metrics",
]

_public.publish(globals())
