"""Rollout-training mismatch: the metrics against their formulas, and the corrections'
losses and gradients (truncated IS per token and per sequence, token and sequence
rejection) against hand computations; with no correction the loss is unchanged."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
import torch
from sc_workers import ActorConfig, ConfigError
from sc_workers.algos import (
    compute_policy_loss,
    compute_rollout_correction,
    rollout_mismatch_metrics,
)
from sc_workers.workers._ppo import policy_loss
from sc_workers.workers._ppo_loop import Meter
from torch import Tensor

LN = math.log


def _rows(*rows: list[float]) -> Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# two sequences of three tokens, the last token of the second is padding
OLD = _rows([-1.0, -2.0, -0.5], [-0.3, -1.2, -4.0])
RATIOS = [[0.4, 1.5, 3.0], [1.2, 1.1, 7.0]]  # exp(old - rollout); 7.0 sits on padding
ROLLOUT = OLD - torch.log(_rows(*RATIOS))
MASK = _rows([1, 1, 1], [1, 1, 0])
ADV = _rows([1.0, -2.0, 0.5], [-1.0, 3.0, 2.0])
STEP = 0.05  # the new policy's log-prob is old + STEP: ratio exp(0.05), inside the clip


def _loss_and_grad(
    weights: Tensor | None, mask: Tensor, old: Tensor = OLD, adv: Tensor = ADV
) -> tuple[Tensor, Tensor]:
    log_prob = (old + STEP).clone().requires_grad_(True)
    loss, *_ = compute_policy_loss(
        old, log_prob, adv, mask, cliprange=0.2, rollout_is_weights=weights
    )
    torch.autograd.backward(loss)
    assert log_prob.grad is not None
    return loss.detach(), log_prob.grad


def _expected(weights: list[list[float]], mask: Tensor, adv: Tensor = ADV) -> tuple[float, Tensor]:
    """token-mean of -A * ratio * w over the mask; d/d log_prob_t = -A_t * ratio * w_t / N
    (inside the clip the ratio's derivative is the ratio itself)."""
    ratio = math.exp(STEP)
    w = _rows(*weights)
    n = float(mask.sum())
    per_token = -adv * ratio * w * mask
    return float(per_token.sum() / n), per_token / n


# ------------------------------------------------------------------ metrics
def test_the_metrics_follow_their_formulas() -> None:
    m = rollout_mismatch_metrics(OLD, ROLLOUT, MASK, bounds=(0.5, 2.0))
    d = [LN(r) for r in (0.4, 1.5, 3.0, 1.2, 1.1)]  # the five masked tokens
    seq = [LN(0.4) + LN(1.5) + LN(3.0), LN(1.2) + LN(1.1)]
    assert m["rollout_corr/log_prob_abs_diff_mean"] == pytest.approx(sum(map(abs, d)) / 5)
    assert m["rollout_corr/log_prob_abs_diff_max"] == pytest.approx(LN(3.0))
    assert m["rollout_corr/kl"] == pytest.approx(sum(-x for x in d) / 5)
    k3 = [math.exp(x) - x - 1 for x in d]
    assert m["rollout_corr/k3_kl"] == pytest.approx(sum(k3) / 5)
    assert m["rollout_corr/seq_log_ratio_mean"] == pytest.approx(sum(seq) / 2)
    assert m["rollout_corr/seq_log_ratio_max"] == pytest.approx(max(seq))
    assert m["rollout_corr/seq_log_ratio_min"] == pytest.approx(min(seq))
    # 0.4 and 3.0 are outside [0.5, 2]; the padding token's 7.0 does not count
    assert m["rollout_corr/token_out_of_bounds_fraction"] == pytest.approx(2 / 5)
    # sequence ratios 1.8 and 1.32 are inside
    assert m["rollout_corr/seq_out_of_bounds_fraction"] == 0.0
    tight = rollout_mismatch_metrics(OLD, ROLLOUT, MASK, bounds=(0.9, 1.5))
    assert tight["rollout_corr/seq_out_of_bounds_fraction"] == pytest.approx(1 / 2)


def test_metrics_of_identical_policies_are_zero_and_of_an_empty_mask_absent() -> None:
    m = rollout_mismatch_metrics(OLD, OLD.clone(), MASK)
    assert m["rollout_corr/kl"] == 0.0
    assert m["rollout_corr/k3_kl"] == 0.0
    assert m["rollout_corr/log_prob_abs_diff_max"] == 0.0
    assert m["rollout_corr/token_out_of_bounds_fraction"] == 0.0
    assert rollout_mismatch_metrics(OLD, ROLLOUT, torch.zeros_like(MASK)) == {}


# ------------------------------------------------------------------ corrections
def test_token_level_truncated_is_loss_and_gradient() -> None:
    corr = compute_rollout_correction(
        OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold=2.0
    )
    assert corr.rollout_is_weights is not None
    weights = [[0.4, 1.5, 2.0], [1.2, 1.1, 0.0]]  # 3.0 capped at 2; padding 0
    assert torch.allclose(corr.rollout_is_weights, _rows(*weights))
    assert corr.response_mask is MASK
    assert corr.metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert corr.metrics["rollout_corr/rollout_is_truncated_fraction"] == pytest.approx(1 / 5)
    loss, grad = _loss_and_grad(corr.rollout_is_weights, MASK)
    want_loss, want_grad = _expected(weights, MASK)
    assert float(loss) == pytest.approx(want_loss)
    assert torch.allclose(grad, want_grad)
    # the capped token: d/d log_prob = -A * ratio * C / N = -0.5 * e^0.05 * 2 / 5
    assert float(grad[0, 2]) == pytest.approx(-0.5 * math.exp(STEP) * 2.0 / 5)


def test_the_weights_carry_no_gradient() -> None:
    w = torch.full_like(OLD, 1.5).requires_grad_(True)
    _loss_and_grad(w, MASK)
    assert w.grad is None


def test_sequence_level_is_caps_the_product_of_ratios() -> None:
    corr = compute_rollout_correction(
        OLD, ROLLOUT, MASK, rollout_is="sequence", rollout_is_threshold=1.5
    )
    # sequence ratios: 0.4 * 1.5 * 3.0 = 1.8 (above the cap 1.5), 1.2 * 1.1 = 1.32
    weights = [[1.5, 1.5, 1.5], [1.32, 1.32, 0.0]]
    assert corr.rollout_is_weights is not None
    assert torch.allclose(corr.rollout_is_weights, _rows(*weights))
    loss, grad = _loss_and_grad(corr.rollout_is_weights, MASK)
    want_loss, want_grad = _expected(weights, MASK)
    assert float(loss) == pytest.approx(want_loss)
    assert torch.allclose(grad, want_grad)
    assert float(grad[1, 1]) == pytest.approx(-3.0 * math.exp(STEP) * 1.32 / 5)


def test_token_rejection_drops_tokens_from_the_loss_and_its_denominator() -> None:
    corr = compute_rollout_correction(
        OLD, ROLLOUT, MASK, rollout_rs="token", rollout_rs_threshold=2.0
    )  # lower bound defaults to 1 / 2
    assert corr.rollout_is_weights is None
    kept = _rows([0, 1, 0], [1, 1, 0])  # 0.4 and 3.0 are outside [0.5, 2]
    assert torch.equal(corr.response_mask, kept)
    assert corr.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert corr.metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    loss, grad = _loss_and_grad(None, corr.response_mask)
    want_loss, want_grad = _expected([[1.0] * 3] * 2, kept)
    assert float(loss) == pytest.approx(want_loss)
    assert torch.allclose(grad, want_grad)
    assert float(grad[0, 0]) == 0.0  # the rejected tokens
    assert float(grad[0, 2]) == 0.0
    assert float(grad[0, 1]) == pytest.approx(2.0 * math.exp(STEP) / 3)  # N = 3 kept tokens


def test_sequence_rejection_drops_whole_sequences() -> None:
    corr = compute_rollout_correction(
        OLD,
        ROLLOUT,
        MASK,
        rollout_rs="sequence",
        rollout_rs_threshold=1.5,
        rollout_rs_threshold_lower=0.9,
    )
    kept = _rows([0, 0, 0], [1, 1, 0])  # 1.8 > 1.5: the first sequence goes
    assert torch.equal(corr.response_mask, kept)
    assert corr.metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    loss, grad = _loss_and_grad(None, corr.response_mask)
    want_loss, want_grad = _expected([[1.0] * 3] * 2, kept)
    assert float(loss) == pytest.approx(want_loss)
    assert torch.allclose(grad, want_grad)
    assert torch.equal(grad[0], torch.zeros(3, dtype=grad.dtype))


def test_is_and_rejection_together() -> None:
    corr = compute_rollout_correction(
        OLD,
        ROLLOUT,
        MASK,
        rollout_is="token",
        rollout_is_threshold=2.0,
        rollout_rs="token",
        rollout_rs_threshold=2.5,
        rollout_rs_threshold_lower=0.5,
    )
    kept = _rows([0, 1, 0], [1, 1, 0])  # 0.4 < 0.5 and 3.0 > 2.5
    assert torch.equal(corr.response_mask, kept)
    weights = [[0.4, 1.5, 2.0], [1.2, 1.1, 0.0]]
    loss, grad = _loss_and_grad(corr.rollout_is_weights, corr.response_mask)
    want_loss, want_grad = _expected(weights, kept)
    assert float(loss) == pytest.approx(want_loss)
    assert torch.allclose(grad, want_grad)


def test_a_row_sampled_across_two_weight_versions() -> None:
    """A partial rollout: tokens 0-1 of row 0 were sampled with version v, tokens 2-3 with
    v + 1 after a weight sync; each token's rollout log-prob is its own version's."""
    old = _rows([-1.0, -1.0, -1.0, -1.0], [-0.5, -0.5, -0.5, -0.5])
    v0 = [-1.2, -0.9]  # version v's log-probs of tokens 0 and 1
    v1 = [-1.01, -0.98]  # version v + 1's (closer to the trainer's) of tokens 2 and 3
    rollout = _rows([*v0, *v1], [-0.5, -0.5, -0.5, -0.5])
    mask = torch.ones_like(old)
    adv = _rows([1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0])
    token = compute_rollout_correction(
        old, rollout, mask, rollout_is="token", rollout_is_threshold=5.0
    )
    per_token = [math.exp(-1.0 - r) for r in (*v0, *v1)]
    assert token.rollout_is_weights is not None
    assert torch.allclose(token.rollout_is_weights[0], torch.tensor(per_token, dtype=old.dtype))
    assert torch.allclose(token.rollout_is_weights[1], torch.ones(4, dtype=old.dtype))
    seq = compute_rollout_correction(
        old, rollout, mask, rollout_is="sequence", rollout_is_threshold=5.0
    )
    product = math.prod(per_token)
    assert seq.rollout_is_weights is not None
    assert torch.allclose(seq.rollout_is_weights[0], torch.full((4,), product, dtype=old.dtype))
    loss, grad = _loss_and_grad(token.rollout_is_weights, mask, old, adv)
    want_loss, want_grad = _expected([per_token, [1.0] * 4], mask, adv)
    assert float(loss) == pytest.approx(want_loss)
    assert torch.allclose(grad, want_grad)
    m = rollout_mismatch_metrics(old, rollout, mask)
    assert m["rollout_corr/seq_log_ratio_max"] == pytest.approx(math.log(product))


# ------------------------------------------------------------------ corrections off
def _reference_loss(old: Tensor, log_prob: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """compute_policy_loss as it was before the correction (token-mean, clip 0.2, c = 3)."""
    ratio = torch.exp(torch.clamp(log_prob - old, min=-20.0, max=20.0))
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 0.8, 1.2)
    clip_max = torch.maximum(unclipped, clipped)
    clip_min = torch.minimum(-adv * 3.0, clip_max)
    losses = torch.where(adv < 0, clip_min, clip_max)
    return (losses * mask).sum() / mask.sum().clamp(min=1)


def test_without_weights_the_loss_is_bit_identical() -> None:
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(4, 6, generator=gen)
    log_prob = old + 0.3 * torch.randn(4, 6, generator=gen)
    adv = torch.randn(4, 6, generator=gen)
    mask = (torch.rand(4, 6, generator=gen) > 0.2).float()
    loss, *_ = compute_policy_loss(old, log_prob, adv, mask)
    assert torch.equal(loss, _reference_loss(old, log_prob, adv, mask))
    ones, *_ = compute_policy_loss(old, log_prob, adv, mask, rollout_is_weights=torch.ones(4, 6))
    assert torch.equal(ones, loss)


def _micro(**extra: Tensor) -> dict[str, Tensor]:
    return {
        "old_log_probs": OLD.float(),
        "advantages": ADV.float(),
        "response_mask": MASK.float(),
        **extra,
    }


def test_the_actor_loss_uses_the_weights_column_when_present() -> None:
    config = ActorConfig(entropy_coeff=0.0)
    meter = Meter(cast(Any, None))  # add() only; nothing is reduced
    entropy = torch.zeros_like(OLD.float())

    def run(micro: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        log_prob = (OLD.float() + STEP).requires_grad_(True)
        loss = policy_loss(
            log_prob, entropy, micro, config, float(micro["response_mask"].sum()), meter
        )
        torch.autograd.backward(loss)
        assert log_prob.grad is not None
        return loss.detach(), log_prob.grad

    plain, _ = run(_micro())
    direct, *_ = compute_policy_loss(
        OLD.float(), OLD.float() + STEP, ADV.float(), MASK.float(), denominator=5.0
    )
    assert torch.equal(plain, direct)
    corr = compute_rollout_correction(
        OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token"
    )
    assert corr.rollout_is_weights is not None
    micro = _micro(
        rollout_is_weights=corr.rollout_is_weights.float(),
        response_mask=corr.response_mask.float(),
    )
    loss, grad = run(micro)
    kept = corr.response_mask
    want_loss, want_grad = _expected([[0.4, 1.5, 2.0], [1.2, 1.1, 0.0]], kept)
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    assert torch.allclose(grad.double(), want_grad, atol=1e-6)


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rollout_is": "tokens"}, r"rollout_is must be one of \('token', 'sequence'\)"),
        ({"rollout_rs": "geometric"}, "rollout_rs must be one of"),
        ({"rollout_is": "token", "rollout_is_threshold": 0.0}, "rollout_is_threshold must be"),
        ({"rollout_rs": "token", "rollout_rs_threshold": -1.0}, "rollout_rs_threshold must be"),
        (
            {"rollout_rs": "token", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 2.0},
            r"rollout_rs_threshold_lower \(2.0\) must be below rollout_rs_threshold \(2.0\)",
        ),
        ({"rollout_is_threshold": 0.5}, "rollout_is_threshold must be > 1 when it also sets"),
        ({"rollout_rs_threshold_lower": 3.0}, r"rollout_rs_threshold_lower \(3.0\) must be below"),
    ],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        compute_rollout_correction(OLD, ROLLOUT, MASK, **kwargs)


def test_bad_metric_bounds_and_shapes_are_refused() -> None:
    with pytest.raises(ConfigError, match="lower bound"):
        rollout_mismatch_metrics(OLD, ROLLOUT, MASK, bounds=(2.0, 2.0))
    with pytest.raises(ValueError, match="same"):
        rollout_mismatch_metrics(OLD, ROLLOUT[:, :2], MASK)
