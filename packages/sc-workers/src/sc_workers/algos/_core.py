"""RL math as pure tensor functions (verl's names and conventions).

Shapes: ``[batch, response_length]`` for token-level tensors, ``response_mask`` 1 on the
tokens the model generated and 0 on padding and on tokens it did not (the tool tokens in
the holes of a multi-turn response). Losses are aggregated by :func:`agg_loss`; its
``denominator`` argument lets a data-parallel caller divide by the *global* number of
tokens (or sequences) of a mini-batch, which makes the gradient independent of how the
mini-batch is split across ranks and micro-batches.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .._errors import BatchError, ConfigError

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "agg_loss_denominator",
    "ban_logits_",
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

_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


def _same_shape(where: str, **tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise BatchError(f"{where}: tensors must have the same shape, got {shapes}")


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is set (over ``dim``, or everything)."""
    masked = values * mask
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` where ``mask`` is set; 0 where the mask is empty (not NaN)."""
    total = masked_sum(values, mask, dim)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return total / count.clamp(min=1)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked entries; ``unbiased`` applies Bessel's correction.

    Raises :class:`BatchError` when fewer than two entries are set and ``unbiased`` is on.
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = float(mask.sum().item())
        if count < 2:
            raise BatchError(
                f"masked_var: unbiased variance needs at least 2 masked entries, got {count:g}"
            )
        var = var * count / (count - 1)
    return var


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` over masked entries; mean kept if not shifted."""
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def ban_logits_(logits: Tensor, banned_token_ids: Tensor, labels: Tensor | None = None) -> Tensor:
    """Ban tokens in place: ``logits`` ``[..., vocab]`` (floating point) take their dtype's
    lowest finite value at every id of ``banned_token_ids`` ``[..., K]`` (int64, padded with
    -1; a position whose ids are all -1 bans nothing). Returns ``logits``.

    A softmax of the result is the model's distribution renormalised over the allowed
    tokens, what a sampler that never draws the banned ones samples from: the banned
    tokens' ``exp`` underflows to exactly 0, so the allowed tokens' log-probs are those of
    ``-inf`` logits, while their ``p * log p`` terms are ``0 * finite`` (an entropy, not
    NaN) and no gradient reaches them. The cost is one write per banned id, no
    ``[..., vocab]`` mask. ``labels`` ``[...]`` (the tokens whose log-probs are wanted) must
    not be banned at their own position: a :class:`BatchError` says where one is.
    """
    if not logits.is_floating_point():
        raise BatchError(f"ban_logits_: logits must be floating point, got {logits.dtype}")
    if banned_token_ids.dtype != torch.int64:
        raise BatchError(
            f"ban_logits_: banned_token_ids must be int64, got {banned_token_ids.dtype}"
        )
    if banned_token_ids.dim() != logits.dim() or banned_token_ids.shape[:-1] != logits.shape[:-1]:
        raise BatchError(
            f"ban_logits_: banned_token_ids {tuple(banned_token_ids.shape)} must be "
            f"logits' {tuple(logits.shape)} with the vocabulary replaced by K"
        )
    banned = banned_token_ids.to(logits.device)
    valid = banned >= 0
    if not bool(valid.any()):
        return logits
    vocab = logits.shape[-1]
    bad = banned[(banned < -1) | (banned >= vocab)]
    if bad.numel():
        raise BatchError(
            f"ban_logits_: banned_token_ids hold {bad[:4].tolist()}, outside -1 (padding) "
            f"and 0..{vocab - 1}"
        )
    if labels is not None:
        own = (banned == labels.to(banned.device).unsqueeze(-1)).any(dim=-1)
        if bool(own.any()):
            where = own.nonzero()[0].tolist()
            raise BatchError(
                f"ban_logits_: the token at position {where} is one its own sampling banned "
                f"({int(labels[tuple(where)])}); a sampler never draws a banned token"
            )
    index = valid.nonzero(as_tuple=True)
    positions = (*index[:-1], banned[index])  # the rows' positions, then the banned ids
    logits[positions] = torch.finfo(logits.dtype).min
    return logits


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """``log softmax(logits)[label]`` for each position: ``[..., vocab]`` -> ``[...]``."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at each position: ``[..., vocab]`` -> ``[...]``."""
    logits = logits.float()
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def agg_loss_denominator(loss_mask: Tensor, loss_agg_mode: str) -> Tensor:
    """What :func:`agg_loss` divides by for this batch: tokens, or non-empty sequences."""
    if loss_agg_mode == "token-mean":
        return loss_mask.sum()
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return (loss_mask.sum(dim=-1) > 0).sum()
    raise ConfigError(f"loss_agg_mode must be one of {list(_AGG_MODES)}, got {loss_agg_mode!r}")


def agg_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    loss_agg_mode: str,
    denominator: float | Tensor | None = None,
) -> Tensor:
    """Aggregate a token-level loss ``[batch, length]`` into a scalar.

    * ``token-mean``: sum over all masked tokens / number of masked tokens;
    * ``seq-mean-token-sum``: per-sequence sum, averaged over sequences;
    * ``seq-mean-token-mean``: per-sequence mean, averaged over sequences.

    Sequences without a masked token do not count. ``denominator`` replaces the local
    count (tokens or sequences) by a caller-supplied one, e.g. the global count of a
    data-parallel mini-batch; it is clamped to at least 1.
    """
    _same_shape("agg_loss", loss_mat=loss_mat, loss_mask=loss_mask)
    local = agg_loss_denominator(loss_mask, loss_agg_mode)
    denom = local if denominator is None else denominator
    denom_t = torch.as_tensor(denom, dtype=loss_mat.dtype, device=loss_mat.device).clamp(min=1)
    if loss_agg_mode == "token-mean":
        total = masked_sum(loss_mat, loss_mask)
    elif loss_agg_mode == "seq-mean-token-sum":
        total = masked_sum(loss_mat, loss_mask, dim=-1).sum()
    else:
        tokens = loss_mask.sum(dim=-1)
        seq_mean = masked_sum(loss_mat, loss_mask, dim=-1) / tokens.clamp(min=1)
        total = seq_mean.sum()
    return total / denom_t


def compute_gae_advantage_return(
    token_level_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over the response tokens.

    Masked positions are skipped (the recursion carries the next valid value and
    advantage through them, their rewards and values unused), so the value after the last
    response token is 0 and a response with holes gets, on its model tokens, the result of
    the same response with the holes cut out.
    Returns ``(advantages, returns)`` where ``returns = raw advantages + values`` and the
    advantages are whitened over the mask; both are 0 on masked positions.
    """
    _same_shape(
        "compute_gae_advantage_return",
        token_level_rewards=token_level_rewards,
        values=values,
        response_mask=response_mask,
    )
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        batch, length = values.shape
        next_value = torch.zeros(batch, dtype=values.dtype, device=values.device)
        last_gae = torch.zeros_like(next_value)
        advantages = torch.zeros_like(values)
        for t in reversed(range(length)):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            gae = delta + gamma * lam * last_gae
            m = mask[:, t]
            next_value = m * values[:, t] + (1 - m) * next_value
            last_gae = m * gae + (1 - m) * last_gae
            advantages[:, t] = last_gae
        returns = (advantages + values) * mask
        advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


def compute_grpo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Sequence[object] | np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[Tensor, Tensor]:
    """GRPO: each response's total reward, normalised within its group (same ``index``).

    score = (reward - group mean) / (group std + epsilon), the std being unbiased; a group
    of one has mean 0 and std 1. With ``norm_adv_by_std_in_grpo=False`` only the mean is
    subtracted (Dr. GRPO). Returns ``(advantages, returns)``, equal, broadcast over the
    response mask.
    """
    _same_shape(
        "compute_grpo_outcome_advantage",
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
    )
    if len(index) != token_level_rewards.shape[0]:
        raise BatchError(
            f"compute_grpo_outcome_advantage: index has {len(index)} entries for "
            f"{token_level_rewards.shape[0]} responses"
        )
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        groups: dict[object, list[int]] = defaultdict(list)
        for i, key in enumerate(index):
            groups[key].append(i)
        normed = torch.empty_like(scores)
        for members in groups.values():
            group = scores[members]
            if len(members) == 1:
                mean = torch.zeros((), dtype=scores.dtype, device=scores.device)
                std = torch.ones((), dtype=scores.dtype, device=scores.device)
            else:
                mean, std = group.mean(), group.std()
            centred = group - mean
            normed[members] = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
        advantages = normed[:, None] * response_mask.to(scores.dtype)
    return advantages, advantages


def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, gamma: float
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted return-to-go per token, whitened over the batch.

    The return-to-go runs over the masked-in tokens only: a masked position (a tool token
    in a hole of a multi-turn response, or right padding) neither adds its reward nor
    discounts, it carries the running return through unchanged (``running = m * (r + gamma
    * running) + (1 - m) * running``). So a response with holes gets, on its model tokens,
    the returns of the same response with the holes cut out, and a final reward reaches
    every turn. Returns ``(advantages, returns)``; both are 0 on masked positions.
    """
    _same_shape(
        "compute_reinforce_plus_plus_outcome_advantage",
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
    )
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[1])):
            m = mask[:, t]
            running = m * (token_level_rewards[:, t] + gamma * running) + (1 - m) * running
            returns[:, t] = running * m
        advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


def compute_policy_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cliprange: float = 0.2,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    denominator: float | Tensor | None = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO clipped surrogate with dual clip for negative advantages.

    ratio = exp(log_prob - old_log_prob) (log-ratio clamped to [-20, 20]);
    loss = max(-A * ratio, -A * clip(ratio, 1 - low, 1 + high)), and for A < 0 also
    min(that, -A * clip_ratio_c). Returns ``(pg_loss, pg_clipfrac, ppo_kl,
    pg_clipfrac_lower)``: the aggregated loss, the fraction of tokens where the upper
    clip was active, the mean approximate KL(old || new) and the fraction where the dual
    clip was active.

    ``rollout_is_weights`` (``[batch, length]``, see :func:`compute_rollout_correction`)
    multiply the per-token loss after the clipping, detached (they carry no gradient): the
    rollout-correction importance weights. ``None`` leaves the loss as it was.
    """
    _same_shape(
        "compute_policy_loss",
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
    )
    if clip_ratio_c <= 1.0:
        raise ConfigError(f"compute_policy_loss: clip_ratio_c must be > 1.0, got {clip_ratio_c}")
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clip_max = torch.maximum(unclipped, clipped)
    pg_clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask)
    dual = -advantages * clip_ratio_c
    clip_min = torch.minimum(dual, clip_max)
    pg_clipfrac_lower = masked_mean(
        (torch.gt(clip_max, dual) & (advantages < 0)).float(), response_mask
    )
    pg_losses = torch.where(advantages < 0, clip_min, clip_max)
    if rollout_is_weights is not None:
        _same_shape(
            "compute_policy_loss", pg_losses=pg_losses, rollout_is_weights=rollout_is_weights
        )
        pg_losses = pg_losses * rollout_is_weights.detach().to(pg_losses.dtype)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, denominator)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    response_mask: Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    denominator: float | Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Clipped value loss: 0.5 * max((v - R)^2, (clip(v, V - c, V + c) - R)^2).

    ``values`` are the old value predictions V. Returns ``(vf_loss, vf_clipfrac)``.
    """
    _same_shape(
        "compute_value_loss",
        vpreds=vpreds,
        returns=returns,
        values=values,
        response_mask=response_mask,
    )
    # clamp against tensors returns ``vpreds`` bit-for-bit where no bound is active
    vpred_clipped = torch.clamp(vpreds, min=values - cliprange_value, max=values + cliprange_value)
    losses_unclipped = (vpreds - returns) ** 2
    losses_clipped = (vpred_clipped - returns) ** 2
    losses = torch.maximum(losses_unclipped, losses_clipped)
    vf_loss = 0.5 * agg_loss(losses, response_mask, loss_agg_mode, denominator)
    vf_clipfrac = masked_mean(torch.gt(losses_clipped, losses_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac


def kl_penalty(logprob: Tensor, ref_logprob: Tensor, kl_penalty: str) -> Tensor:
    """Per-token KL estimate between the policy and the reference policy.

    * ``kl`` / ``k1``: log p - log q;
    * ``abs``: |log p - log q|;
    * ``mse`` / ``k2``: 0.5 (log p - log q)^2;
    * ``low_var_kl`` / ``k3``: exp(log q - log p) - (log q - log p) - 1, clamped to [-10, 10].
    """
    _same_shape("kl_penalty", logprob=logprob, ref_logprob=ref_logprob)
    diff = logprob - ref_logprob
    if kl_penalty in ("kl", "k1"):
        return diff
    if kl_penalty == "abs":
        return diff.abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * diff.square()
    if kl_penalty in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(-diff, min=-20.0, max=20.0)
        kl = torch.exp(log_ratio) - log_ratio - 1
        return torch.clamp(kl, min=-10.0, max=10.0)
    raise ConfigError(
        f"kl_penalty must be one of ['kl', 'k1', 'abs', 'mse', 'k2', 'low_var_kl', 'k3'], "
        f"got {kl_penalty!r}"
    )


class FixedKLController:
    """A constant KL coefficient (``kl_ctrl.type: fixed``)."""

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ConfigError(f"FixedKLController: kl_coef must be >= 0, got {kl_coef}")
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


class AdaptiveKLController:
    """The adaptive KL coefficient of Ziegler et al. (``kl_ctrl.type: adaptive``).

    After each batch the coefficient is multiplied by ``1 + clip(kl / target - 1, -0.2,
    0.2) * n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if init_kl_coef < 0 or target_kl <= 0 or horizon <= 0:
            raise ConfigError(
                f"AdaptiveKLController: need init_kl_coef >= 0, target_kl > 0 and horizon > 0, "
                f"got {init_kl_coef}, {target_kl}, {horizon}"
            )
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_steps / self.horizon
