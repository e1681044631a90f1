"""Rollout-training mismatch: how far the sampler's log-probs are from the trainer's, and
the corrections for it (verl's "rollout correction": ``algorithm.rollout_correction``).

Both take ``old_log_probs`` (the training policy's log-probs of the sampled tokens,
recomputed by the actor before the update), ``rollout_log_probs`` (the log-prob each token
was sampled with, as the sampler reported it) and ``response_mask``, all
``[batch, response_length]``. The per-token log-ratio is

    log_ratio_t = old_log_probs_t - rollout_log_probs_t = log (pi_train / pi_rollout)

and a sequence's log-ratio is its sum over the sequence's response tokens (the log of the
product of its token ratios). Everything is computed token by token, so a row whose tokens
were sampled with different weight versions (a partial rollout resumed after a weight sync)
is handled like any other: each token carries the log-prob it was sampled with.

Exponentials are taken of log-ratios clamped to [-20, 20] (:data:`SAFETY_BOUND`); threshold
checks are made in log space, on the unclamped values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .._errors import BatchError, ConfigError

__all__ = [
    "ROLLOUT_IS_MODES",
    "ROLLOUT_RS_MODES",
    "RolloutCorrection",
    "SAFETY_BOUND",
    "check_rollout_correction",
    "compute_rollout_correction",
    "rollout_mismatch_metrics",
]

#: log-ratios are clamped to [-SAFETY_BOUND, SAFETY_BOUND] before they are exponentiated
SAFETY_BOUND = 20.0
#: ``rollout_is``: truncated importance-sampling weights per token, or per sequence
ROLLOUT_IS_MODES = ("token", "sequence")
#: ``rollout_rs``: rejection (masking) of tokens, or of whole sequences, outside the bounds
ROLLOUT_RS_MODES = ("token", "sequence")


def _check_shapes(where: str, old: Tensor, rollout: Tensor, mask: Tensor) -> None:
    shapes = {tuple(old.shape), tuple(rollout.shape), tuple(mask.shape)}
    if len(shapes) != 1 or old.dim() != 2:
        raise BatchError(
            f"{where}: old_log_probs, rollout_log_probs and response_mask must be the same "
            f"[batch, length] shape, got {tuple(old.shape)}, {tuple(rollout.shape)}, "
            f"{tuple(mask.shape)}"
        )


def _check_bounds(where: str, lower: float, upper: float, names: tuple[str, str]) -> None:
    for name, value in zip(names, (lower, upper), strict=True):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{where}: {name} must be a number > 0, got {value!r}")
    if not lower < upper:
        raise ConfigError(f"{where}: {names[0]} ({lower!r}) must be below {names[1]} ({upper!r})")


def _log_ratios(old: Tensor, rollout: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(token log-ratios, 0 off the mask; the mask as bools; per-sequence sums)."""
    valid = mask.bool()
    log_ratio = torch.where(
        valid, old.double() - rollout.double(), torch.zeros((), dtype=torch.float64)
    )
    return log_ratio, valid, log_ratio.sum(dim=-1)


def rollout_mismatch_metrics(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    response_mask: Tensor,
    bounds: tuple[float, float] = (0.5, 2.0),
) -> dict[str, float]:
    """Mismatch statistics between the sampling policy and the training policy.

    With ``d_t = old_log_probs_t - rollout_log_probs_t`` on the masked tokens, ``S_i`` the
    sum of ``d_t`` over sequence ``i``'s masked tokens and ``(lower, upper) = bounds``
    (bounds on the *ratio* ``exp(d)``):

    * ``rollout_corr/log_prob_abs_diff_mean``, ``_max``: mean and max of ``|d_t|``;
    * ``rollout_corr/kl``: ``mean(-d_t)``, the k1 estimate of KL(pi_rollout || pi_train)
      (the tokens are samples of pi_rollout; verl's direction);
    * ``rollout_corr/k3_kl``: ``mean(exp(d_t) - d_t - 1)``, the k3 estimate of the same KL
      (never negative);
    * ``rollout_corr/seq_log_ratio_mean``, ``_max``, ``_min``: of ``S_i`` over the
      sequences with at least one masked token;
    * ``rollout_corr/token_out_of_bounds_fraction``: the tokens whose ``exp(d_t)`` is
      outside ``[lower, upper]``; ``rollout_corr/seq_out_of_bounds_fraction``: the
      sequences whose ``exp(S_i)`` is.

    Means over tokens count every masked token of the batch once. An empty mask gives
    ``{}``.
    """
    where = "rollout_mismatch_metrics"
    _check_shapes(where, old_log_probs, rollout_log_probs, response_mask)
    lower, upper = bounds
    _check_bounds(where, lower, upper, ("lower bound", "upper bound"))
    log_ratio, valid, seq_sum = _log_ratios(old_log_probs, rollout_log_probs, response_mask)
    if not bool(valid.any()):
        return {}
    d = log_ratio[valid]
    has_tokens = valid.any(dim=-1)
    seq = seq_sum[has_tokens]
    log_lo, log_hi = math.log(lower), math.log(upper)
    k3 = torch.exp(d.clamp(-SAFETY_BOUND, SAFETY_BOUND)) - d - 1.0
    return {
        "rollout_corr/log_prob_abs_diff_mean": float(d.abs().mean()),
        "rollout_corr/log_prob_abs_diff_max": float(d.abs().max()),
        "rollout_corr/kl": float((-d).mean()),
        "rollout_corr/k3_kl": float(k3.mean()),
        "rollout_corr/seq_log_ratio_mean": float(seq.mean()),
        "rollout_corr/seq_log_ratio_max": float(seq.max()),
        "rollout_corr/seq_log_ratio_min": float(seq.min()),
        "rollout_corr/token_out_of_bounds_fraction": float(
            ((d < log_lo) | (d > log_hi)).double().mean()
        ),
        "rollout_corr/seq_out_of_bounds_fraction": float(
            ((seq < log_lo) | (seq > log_hi)).double().mean()
        ),
    }


@dataclass(frozen=True)
class RolloutCorrection:
    """What :func:`compute_rollout_correction` gives: the importance-sampling weights
    (``None`` without ``rollout_is``; detached, 0 off the mask), the response mask with the
    rejected tokens zeroed (``response_mask`` itself without ``rollout_rs``) and the
    correction's metrics."""

    rollout_is_weights: Tensor | None
    response_mask: Tensor
    metrics: dict[str, float]


def check_rollout_correction(
    rollout_is: str | None,
    rollout_is_threshold: float,
    rollout_rs: str | None,
    rollout_rs_threshold: float | None,
    rollout_rs_threshold_lower: float | None,
    where: str = "rollout_correction",
) -> tuple[float, float]:
    """Check a correction's settings (:class:`ConfigError` names the bad one); returns the
    rejection bounds ``(lower, upper)`` on the ratio: ``rollout_rs_threshold`` (default
    ``rollout_is_threshold``) and ``rollout_rs_threshold_lower`` (default its reciprocal).
    They are also the bounds of the mismatch metrics' out-of-bounds fractions."""
    if rollout_is is not None and rollout_is not in ROLLOUT_IS_MODES:
        raise ConfigError(
            f"{where}.rollout_is must be one of {ROLLOUT_IS_MODES} or None, got {rollout_is!r}"
        )
    if rollout_rs is not None and rollout_rs not in ROLLOUT_RS_MODES:
        raise ConfigError(
            f"{where}.rollout_rs must be one of {ROLLOUT_RS_MODES} or None, got {rollout_rs!r}"
        )
    for name, value in (
        ("rollout_is_threshold", rollout_is_threshold),
        ("rollout_rs_threshold", rollout_rs_threshold),
        ("rollout_rs_threshold_lower", rollout_rs_threshold_lower),
    ):
        if value is None and name != "rollout_is_threshold":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{where}.{name} must be a number > 0, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}.{name} must be finite, got {value!r}")
    upper = float(rollout_is_threshold if rollout_rs_threshold is None else rollout_rs_threshold)
    lower = 1.0 / upper if rollout_rs_threshold_lower is None else float(rollout_rs_threshold_lower)
    if not lower < upper:
        if rollout_rs_threshold is None and rollout_rs_threshold_lower is None:
            raise ConfigError(
                f"{where}.rollout_is_threshold must be > 1 when it also sets the rejection and "
                f"metric bounds [1/threshold, threshold], got {rollout_is_threshold!r}"
            )
        raise ConfigError(
            f"{where}: rollout_rs_threshold_lower ({lower!r}) must be below "
            f"rollout_rs_threshold ({upper!r})"
        )
    return lower, upper


def compute_rollout_correction(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    response_mask: Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: float = 2.0,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | None = None,
    rollout_rs_threshold_lower: float | None = None,
) -> RolloutCorrection:
    """Importance-sampling weights and rejection mask for a batch sampled by another policy.

    With ``d_t`` the token log-ratio ``old - rollout`` and ``S_i`` sequence ``i``'s sum:

    * ``rollout_is="token"``: ``w_t = min(exp(d_t), C)``, ``C = rollout_is_threshold``
      (truncated IS, per token);
    * ``rollout_is="sequence"``: ``w_t = min(exp(S_i), C)`` for every token of sequence ``i``;
    * ``rollout_rs="token"``: tokens with ``exp(d_t)`` outside ``[lower, upper]`` are
      zeroed in the mask; ``"sequence"``: whole sequences with ``exp(S_i)`` outside are.

    ``upper`` is ``rollout_rs_threshold`` (default ``C``) and ``lower`` is
    ``rollout_rs_threshold_lower`` (default ``1 / upper``). The weights multiply the
    per-token policy-gradient loss (:func:`compute_policy_loss`'s ``rollout_is_weights``);
    they carry no gradient. Metrics: ``rollout_corr/rollout_is_mean``, ``_max``, ``_min``
    and ``rollout_corr/rollout_is_truncated_fraction`` (the tokens whose weight was capped)
    with IS; ``rollout_corr/rollout_rs_masked_fraction`` (tokens) and
    ``rollout_corr/rollout_rs_seq_masked_fraction`` (sequences losing a token) with RS.
    """
    where = "compute_rollout_correction"
    _check_shapes(where, old_log_probs, rollout_log_probs, response_mask)
    lower, upper = check_rollout_correction(
        rollout_is,
        rollout_is_threshold,
        rollout_rs,
        rollout_rs_threshold,
        rollout_rs_threshold_lower,
        where,
    )
    with torch.no_grad():
        log_ratio, valid, seq_sum = _log_ratios(old_log_probs, rollout_log_probs, response_mask)
        metrics: dict[str, float] = {}
        weights: Tensor | None = None
        if rollout_is is not None:
            level = (
                log_ratio if rollout_is == "token" else seq_sum.unsqueeze(-1).expand_as(log_ratio)
            )
            cap = math.log(rollout_is_threshold)
            raw = torch.exp(level.clamp(-SAFETY_BOUND, SAFETY_BOUND))
            w = torch.where(valid, raw.clamp(max=rollout_is_threshold), torch.zeros_like(raw))
            weights = w.to(old_log_probs.dtype)
            if bool(valid.any()):
                on = w[valid]
                metrics["rollout_corr/rollout_is_mean"] = float(on.mean())
                metrics["rollout_corr/rollout_is_max"] = float(on.max())
                metrics["rollout_corr/rollout_is_min"] = float(on.min())
                metrics["rollout_corr/rollout_is_truncated_fraction"] = float(
                    (level[valid] > cap).double().mean()
                )
        mask = response_mask
        if rollout_rs is not None:
            level = (
                log_ratio if rollout_rs == "token" else seq_sum.unsqueeze(-1).expand_as(log_ratio)
            )
            keep = (level >= math.log(lower)) & (level <= math.log(upper))
            rejected = valid & ~keep
            mask = response_mask * keep.to(response_mask.dtype)
            if bool(valid.any()):
                metrics["rollout_corr/rollout_rs_masked_fraction"] = float(
                    rejected[valid].double().mean()
                )
                metrics["rollout_corr/rollout_rs_seq_masked_fraction"] = float(
                    rejected.any(dim=-1)[valid.any(dim=-1)].double().mean()
                )
    return RolloutCorrection(weights, mask, metrics)
