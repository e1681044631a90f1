"""Invariants of the RL math and the sampler's filters, over generated inputs."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_workers.algos import (
    agg_loss,
    agg_loss_denominator,
    compute_gae_advantage_return,
    compute_policy_loss,
    masked_mean,
    masked_var,
    masked_whiten,
)
from sc_workers.workers import filter_logits

PROPERTY = settings(deadline=None, max_examples=40)
MODES = st.sampled_from(["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])


@st.composite
def batches(draw: st.DrawFn, min_rows: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    rows = draw(st.integers(min_rows, 6))
    cols = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    mask = (torch.rand(rows, cols, generator=g) < 0.7).double()
    return values, mask


@PROPERTY
@given(batches(min_rows=2), MODES, st.data())
def test_split_with_global_denominator_equals_whole(
    batch: tuple[torch.Tensor, torch.Tensor], mode: str, data: st.DataObject
) -> None:
    """What makes dp ranks and micro-batches add up to one process's loss."""
    values, mask = batch
    cut = data.draw(st.integers(1, values.shape[0] - 1))
    denom = agg_loss_denominator(mask, mode)
    parts = agg_loss(values[:cut], mask[:cut], mode, denom) + agg_loss(
        values[cut:], mask[cut:], mode, denom
    )
    assert math.isclose(parts.item(), agg_loss(values, mask, mode).item(), abs_tol=1e-9)


@PROPERTY
@given(batches())
def test_whitened_entries_have_zero_mean_unit_variance(
    batch: tuple[torch.Tensor, torch.Tensor],
) -> None:
    values, mask = batch
    if mask.sum() < 2 or masked_mean((values - masked_mean(values, mask)) ** 2, mask) < 1e-6:
        return
    out = masked_whiten(values, mask)
    assert abs(masked_mean(out, mask).item()) < 1e-6
    count = mask.sum().item()
    var = (masked_mean(out**2, mask) * count / (count - 1)).item()
    # the 1e-8 under the square root shrinks a small variance v to v / (v + 1e-8)
    spread = masked_var(values, mask).item()
    assert math.isclose(var, spread / (spread + 1e-8), rel_tol=1e-7)


@PROPERTY
@given(batches(), st.floats(0.05, 0.5))
def test_policy_loss_at_ratio_one_is_minus_the_advantage(
    batch: tuple[torch.Tensor, torch.Tensor], clip: float
) -> None:
    adv, mask = batch
    logp = torch.zeros_like(adv) - 1.0
    loss, clipfrac, kl, lower = compute_policy_loss(logp, logp, adv, mask, cliprange=clip)
    assert math.isclose(loss.item(), -masked_mean(adv, mask).item(), abs_tol=1e-9)
    assert clipfrac.item() == 0.0
    assert kl.item() == 0.0
    assert lower.item() == 0.0


@PROPERTY
@given(batches(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_gae_returns_are_advantages_plus_values_and_masked(
    batch: tuple[torch.Tensor, torch.Tensor], gamma: float, lam: float
) -> None:
    values, mask = batch
    if mask.sum() < 2:
        return
    rewards = torch.flip(values, dims=[0])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    assert torch.all(adv[mask == 0] == 0)
    assert torch.all(ret[mask == 0] == 0)
    # with lam = 1 the return is the discounted sum of rewards (values cancel)
    ones = torch.ones_like(mask)
    _, ret1 = compute_gae_advantage_return(rewards, values, ones, gamma, 1.0)
    running = torch.zeros(values.shape[0], dtype=values.dtype)
    for t in reversed(range(values.shape[1])):
        running = rewards[:, t] + gamma * running
        torch.testing.assert_close(ret1[:, t], running)


@PROPERTY
@given(
    st.integers(0, 2**16),
    st.integers(2, 40),
    st.integers(-1, 50),
    st.floats(1e-6, 1.0),
)
def test_filtered_logits_keep_the_best_token(
    seed: int, vocab: int, top_k: int, top_p: float
) -> None:
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(seed))
    out = filter_logits(logits, top_k, top_p)
    kept = torch.isfinite(out)
    assert kept.gather(1, logits.argmax(-1, keepdim=True)).all()
    if 0 < top_k < vocab:
        assert (kept.sum(-1) <= top_k).all()
    # kept tokens keep their logits
    assert torch.equal(out[kept], logits[kept])
