"""RL math against values computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from sc_workers import BatchError, ConfigError
from sc_workers.algos import (
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


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def whiten(xs: list[float]) -> list[float]:
    mean, var = statistics.mean(xs), statistics.variance(xs)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


VALUES = t([1, 2, 3], [4, 5, 6])
MASK = t([1, 1, 0], [0, 1, 1])


def test_masked_sum_and_mean() -> None:
    # masked entries 1, 2, 5, 6
    assert masked_sum(VALUES, MASK).item() == 14
    assert masked_mean(VALUES, MASK).item() == 3.5
    assert masked_mean(VALUES, MASK, dim=-1).tolist() == [1.5, 5.5]
    # an empty mask gives 0, not NaN
    assert masked_mean(VALUES, torch.zeros_like(MASK)).item() == 0.0


def test_masked_var_and_whiten() -> None:
    # deviations from 3.5: 6.25 + 2.25 + 2.25 + 6.25 = 17
    assert masked_var(VALUES, MASK, unbiased=False).item() == pytest.approx(17 / 4)
    assert masked_var(VALUES, MASK).item() == pytest.approx(17 / 3)
    out = masked_whiten(VALUES, MASK)
    expected = whiten([1, 2, 5, 6])
    got = [out[0, 0], out[0, 1], out[1, 1], out[1, 2]]
    assert [g.item() for g in got] == pytest.approx(expected)
    kept = masked_whiten(VALUES, MASK, shift_mean=False)
    assert kept[0, 0].item() == pytest.approx(expected[0] + 3.5)


def test_masked_var_needs_two_entries() -> None:
    with pytest.raises(BatchError, match="at least 2 masked entries, got 1"):
        masked_var(VALUES, t([1, 0, 0], [0, 0, 0]))


def test_gae_by_hand() -> None:
    # gamma 0.9, lam 0.8 (gamma * lam = 0.72)
    # seq 0: r = [0, 0, 1], V = [0.2, 0.4, 0.6]
    #   t2: delta = 1 - 0.6 = 0.4                      A = 0.4
    #   t1: delta = 0.9 * 0.6 - 0.4 = 0.14             A = 0.14 + 0.72 * 0.4 = 0.428
    #   t0: delta = 0.9 * 0.4 - 0.2 = 0.16             A = 0.16 + 0.72 * 0.428 = 0.46816
    # seq 1: r = [0, 1, pad], V = [0.2, 0.4, 9 (pad, ignored)]
    #   t1: delta = 1 - 0.4 = 0.6                      A = 0.6
    #   t0: delta = 0.9 * 0.4 - 0.2 = 0.16             A = 0.16 + 0.72 * 0.6 = 0.592
    rewards = t([0, 0, 1], [0, 1, 0])
    values = t([0.2, 0.4, 0.6], [0.2, 0.4, 9.0])
    mask = t([1, 1, 1], [1, 1, 0])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    raw = [0.46816, 0.428, 0.4, 0.592, 0.6]
    assert ret[0].tolist() == pytest.approx([0.66816, 0.828, 1.0])
    assert ret[1].tolist() == pytest.approx([0.792, 1.0, 0.0])
    got = [adv[0, 0], adv[0, 1], adv[0, 2], adv[1, 0], adv[1, 1]]
    assert [g.item() for g in got] == pytest.approx(whiten(raw), rel=1e-6)
    assert adv[1, 2].item() == 0.0


def test_gae_shape_mismatch() -> None:
    with pytest.raises(BatchError, match=r"same shape.*\(2, 3\).*\(2, 2\)"):
        compute_gae_advantage_return(VALUES, VALUES, MASK[:, :2], 1.0, 1.0)


def test_grpo_by_hand() -> None:
    # scores [1, 0, 1, 3]; group a = [1, 0, 1]: mean 2/3, unbiased std sqrt(1/3)
    # group b = [3] alone: mean 0, std 1
    rewards = t([0, 1], [0, 0], [1, 0], [2, 1])
    mask = t([1, 1], [1, 1], [1, 0], [1, 1])
    index = np.array(["a", "a", "a", "b"], dtype=object)
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, index, epsilon=1e-6)
    std = math.sqrt(1 / 3)
    expected = [(1 - 2 / 3) / (std + 1e-6), (0 - 2 / 3) / (std + 1e-6), (1 - 2 / 3) / (std + 1e-6)]
    assert adv[:3, 0].tolist() == pytest.approx(expected)
    assert adv[3, 0].item() == pytest.approx(3 / (1 + 1e-6))
    assert adv[2, 1].item() == 0.0  # masked
    assert torch.equal(adv, ret)
    plain, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert plain[:, 0].tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3, 3.0])


def test_grpo_index_length() -> None:
    with pytest.raises(BatchError, match="index has 3 entries for 2 responses"):
        compute_grpo_outcome_advantage(VALUES, MASK, [0, 0, 1])


def test_reinforce_plus_plus_by_hand() -> None:
    # gamma 0.5; seq 0 r = [0, 0, 1] -> returns [0.25, 0.5, 1]
    # seq 1 r = [0, 2, pad] -> returns [1, 2, 0]
    rewards = t([0, 0, 1], [0, 2, 0])
    mask = t([1, 1, 1], [1, 1, 0])
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    assert ret.tolist() == [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]
    expected = whiten([0.25, 0.5, 1.0, 1.0, 2.0])
    got = [adv[0, 0], adv[0, 1], adv[0, 2], adv[1, 0], adv[1, 1]]
    assert [g.item() for g in got] == pytest.approx(expected, rel=1e-6)
    assert adv[1, 2].item() == 0.0


LOSS = t([1, 2, 3], [4, 5, 6])


@pytest.mark.parametrize(
    ("mode", "mask", "expected"),
    [
        ("token-mean", [[1, 1, 0], [1, 0, 0]], 7 / 3),  # (1 + 2 + 4) / 3
        ("seq-mean-token-sum", [[1, 1, 0], [1, 0, 0]], 3.5),  # (3 + 4) / 2
        ("seq-mean-token-mean", [[1, 1, 0], [1, 0, 0]], 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-mean", [[1, 1, 0], [0, 0, 0]], 1.5),  # the empty sequence is ignored
        ("seq-mean-token-sum", [[1, 1, 0], [0, 0, 0]], 3.0),
    ],
)
def test_agg_loss_modes(mode: str, mask: list[list[float]], expected: float) -> None:
    assert agg_loss(LOSS, t(*mask), mode).item() == pytest.approx(expected)


def test_agg_loss_global_denominator() -> None:
    mask = t([1, 1, 0], [1, 0, 0])
    assert agg_loss_denominator(mask, "token-mean").item() == 3
    assert agg_loss_denominator(mask, "seq-mean-token-sum").item() == 2
    # the sum 7 over a global count of 7 tokens
    assert agg_loss(LOSS, mask, "token-mean", denominator=7).item() == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="got 'token-sum'"):
        agg_loss(LOSS, mask, "token-sum")


def _ratios() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ratio = t([1.5, 0.5, 5.0, 0.5])
    adv = t([1.0, 1.0, -1.0, -1.0])
    return torch.zeros_like(ratio), ratio.log(), adv, torch.ones_like(ratio)


def test_policy_loss_by_hand() -> None:
    # cliprange 0.2, dual clip 3:
    # a: A=1,  r=1.5: max(-1.5, -1.2) = -1.2 (clipped)
    # b: A=1,  r=0.5: max(-0.5, -0.8) = -0.5
    # c: A=-1, r=5:   max(5, 1.2) = 5, dual min(3, 5) = 3 (dual clipped)
    # d: A=-1, r=0.5: max(0.5, 0.8) = 0.8 (clipped), min(3, 0.8) = 0.8
    old, new, adv, mask = _ratios()
    loss, clipfrac, ppo_kl, lower = compute_policy_loss(old, new, adv, mask, cliprange=0.2)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 3 + 0.8) / 4)
    assert clipfrac.item() == pytest.approx(0.5)
    assert lower.item() == pytest.approx(0.25)
    expected_kl = -(math.log(1.5) + math.log(0.5) + math.log(5) + math.log(0.5)) / 4
    assert ppo_kl.item() == pytest.approx(expected_kl)


def test_policy_loss_asymmetric_clip_and_errors() -> None:
    old, new, adv, mask = _ratios()
    # a: clip high 0.3 -> -1.3; d: clip low 0.4 -> max(0.5, 0.6) = 0.6
    loss, *_ = compute_policy_loss(old, new, adv, mask, cliprange_low=0.4, cliprange_high=0.3)
    assert loss.item() == pytest.approx((-1.3 - 0.5 + 3 + 0.6) / 4)
    with pytest.raises(ConfigError, match=r"clip_ratio_c must be > 1\.0, got 1\.0"):
        compute_policy_loss(old, new, adv, mask, clip_ratio_c=1.0)


def test_value_loss_by_hand() -> None:
    # cliprange 0.5
    # 1: v=1,   V=0,   R=0: clip -> 0.5; max(1, 0.25) = 1
    # 2: v=2,   V=1.9, R=3: inside the range; max(1, 1) = 1, not counted as clipped
    # 3: v=0,   V=1,   R=0: clip -> 0.5; max(0, 0.25) = 0.25, clipped
    vpreds, values, returns = t([1.0, 2.0, 0.0]), t([0.0, 1.9, 1.0]), t([0.0, 3.0, 0.0])
    loss, clipfrac = compute_value_loss(vpreds, returns, values, torch.ones_like(vpreds), 0.5)
    assert loss.item() == pytest.approx(0.5 * (1 + 1 + 0.25) / 3)
    assert clipfrac.item() == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("kind", "plus_one", "minus_one"),
    [
        ("kl", 1.0, -1.0),
        ("k1", 1.0, -1.0),
        ("abs", 1.0, 1.0),
        ("mse", 0.5, 0.5),
        ("k2", 0.5, 0.5),
        # exp(q - p) - (q - p) - 1 with q - p = -1 and +1
        ("low_var_kl", math.exp(-1) + 1 - 1, math.exp(1) - 1 - 1),
        ("k3", math.exp(-1), math.e - 2),
    ],
)
def test_kl_penalties(kind: str, plus_one: float, minus_one: float) -> None:
    out = kl_penalty(t([-1.0, -2.0]), t([-2.0, -1.0]), kind)
    assert out[0].tolist() == pytest.approx([plus_one, minus_one])


def test_low_var_kl_is_clamped_and_unknown_kind() -> None:
    assert kl_penalty(t([-40.0]), t([0.0]), "low_var_kl").item() == 10.0
    with pytest.raises(ConfigError, match="got 'full'"):
        kl_penalty(t([0.0]), t([0.0]), "full")


def test_logprobs_and_entropy() -> None:
    # probabilities [0.25, 0.75]
    logits = torch.tensor([[0.0, math.log(3.0)]])
    assert logprobs_from_logits(logits, torch.tensor([1])).item() == pytest.approx(math.log(0.75))
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy_from_logits(logits).item() == pytest.approx(expected)


def test_kl_controllers() -> None:
    fixed = FixedKLController(0.2)
    fixed.update(5.0, 10)
    assert fixed.value == 0.2
    adaptive = AdaptiveKLController(0.1, target_kl=1.0, horizon=10)
    adaptive.update(current_kl=2.0, n_steps=5)  # error clipped to 0.2 -> x (1 + 0.2 * 5 / 10)
    assert adaptive.value == pytest.approx(0.11)
    with pytest.raises(ConfigError, match="horizon > 0"):
        AdaptiveKLController(0.1, 1.0, 0)
    with pytest.raises(ConfigError, match="got -1"):
        FixedKLController(-1)
