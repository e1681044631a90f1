"""RL math: advantage estimators, PPO losses, KL penalties and masked statistics."""

from sc_dispatch import _public

from ._core import (
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    agg_loss_denominator,
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

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "agg_loss_denominator",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_policy_loss",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]

_public.publish(globals())
