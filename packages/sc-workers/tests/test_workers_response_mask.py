"""Responses with holes: a multi-turn session's tool tokens are context (attention mask 1)
but not the model's (response mask 0).

Checked by perturbation: the tool positions' advantages, old, reference and rollout
log-probs, returns and values change nothing in the actor's or the critic's loss, metrics
and update, and the logits' gradient there is exactly 0; the KL term (every type) and the
entropy are means over the model tokens only. Each check is shown able to fail: the same
perturbation of a model token changes the result, and changing the tool tokens' *ids*
changes the model tokens' log-probs after them (the mask does not drop context). The
advantage estimators give a response with holes, on its model tokens, what they give the
same response with the holes cut out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

import pytest
import torch
from _workers_helpers import PROMPT_LEN, actor_config, col, critic_config, full_weights, proto
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sc_workers import ActorRolloutRefConfig, ActorRolloutRefWorker, CriticConfig, CriticWorker
from sc_workers.algos import (
    agg_loss,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_policy_loss,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_value_loss,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
)
from torch import Tensor

pytestmark = pytest.mark.timeout(120)

PROPERTY = settings(deadline=None, max_examples=40)
KL_TYPES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]
AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
AGG_MODES: list[AggMode] = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
VOCAB = 32

#: response masks of three-turn-ish sessions: model tokens 1, tool tokens 0 inside the real
#: length, then right padding (real length in ``REAL``); row 3 has no tool call, row 0 ends
#: with tool tokens
MASKS = [
    [1, 1, 1, 0, 0, 0, 1, 1, 0, 0],
    [1, 1, 0, 0, 1, 1, 1, 0, 0, 0],
    [1, 0, 1, 0, 1, 0, 1, 0, 1, 0],
    [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 1, 1, 1, 1, 1],
    [1, 0, 0, 0, 0, 0, 0, 1, 0, 0],
    [1, 1, 1, 0, 1, 1, 1, 0, 1, 1],
    [1, 1, 0, 1, 0, 0, 0, 0, 0, 0],
]
REAL = [10, 7, 9, 6, 10, 8, 10, 4]
ROWS, RESP = len(MASKS), len(MASKS[0])


def holed_tensors(seed: int = 0) -> dict[str, Tensor]:
    """Left-padded prompts and responses with tool tokens in holes, with the PPO columns."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, VOCAB, (ROWS, PROMPT_LEN), generator=g)
    responses = torch.randint(2, VOCAB, (ROWS, RESP), generator=g)
    prompt_mask = torch.ones(ROWS, PROMPT_LEN, dtype=torch.long)
    real = torch.zeros(ROWS, RESP, dtype=torch.long)
    for i, n in enumerate(REAL):
        prompt_mask[i, : i % 3] = 0
        prompts[i, : i % 3] = 0
        real[i, :n] = 1
    responses = responses * real
    attention_mask = torch.cat([prompt_mask, real], dim=1)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": torch.tensor(MASKS),
        "old_log_probs": -3.0 + 0.1 * torch.randn(ROWS, RESP, generator=g),
        "ref_log_prob": -3.0 + 0.1 * torch.randn(ROWS, RESP, generator=g),
        "rollout_log_probs": -3.0 + 0.1 * torch.randn(ROWS, RESP, generator=g),
        "advantages": torch.randn(ROWS, RESP, generator=g),
        "values": 0.1 * torch.randn(ROWS, RESP, generator=g),
        "returns": torch.randn(ROWS, RESP, generator=g),
    }


def tool_positions(t: dict[str, Tensor]) -> Tensor:
    """Real response tokens the model did not generate."""
    return t["attention_mask"][:, PROMPT_LEN:].bool() & ~t["response_mask"].bool()


def perturbed(
    t: dict[str, Tensor], keys: list[str], where: Tensor, seed: int = 1
) -> dict[str, Tensor]:
    """A copy of ``t`` with large random values in ``keys`` at ``where``."""
    g = torch.Generator().manual_seed(seed)
    out = dict(t)
    for key in keys:
        noise = 1e3 * torch.randn(t[key].shape, generator=g)
        out[key] = torch.where(where, noise, t[key])
    return out


def one_model_position(t: dict[str, Tensor]) -> Tensor:
    """The mask of one model token (row 0's last before its first hole)."""
    where = torch.zeros(ROWS, RESP, dtype=torch.bool)
    where[0, 2] = True
    return where


def test_the_batch_has_holes_and_padding() -> None:
    t = holed_tensors()
    tools = tool_positions(t)
    assert int(tools.sum()) == sum(REAL) - sum(map(sum, MASKS)) > 10
    assert not bool(one_model_position(t)[tools].any())
    assert bool(t["response_mask"][0, 2])
    assert not bool(tools[3].any())
    assert int((t["attention_mask"][:, PROMPT_LEN:] == 0).sum()) > 0  # right padding too


# --- the actor ------------------------------------------------------------------------------


def _actor_cfg(
    kl_loss_type: str = "low_var_kl", loss_agg_mode: AggMode = "token-mean"
) -> ActorRolloutRefConfig:
    """The helpers' actor (entropy bonus, KL loss), one mini-batch of micro-batches of 2."""
    cfg = actor_config(mini=ROWS, micro=2)
    actor = dataclasses.replace(cfg.actor, kl_loss_type=kl_loss_type, loss_agg_mode=loss_agg_mode)
    return dataclasses.replace(cfg, actor=actor)


def _update(
    cfg: ActorRolloutRefConfig, t: dict[str, Tensor]
) -> tuple[dict[str, float], dict[str, Tensor]]:
    """One update of a fresh actor (the same initial weights every time)."""
    w = ActorRolloutRefWorker(cfg, "actor")
    w.init_model()
    metrics = w.update_actor(proto(t, temperature=1.0)).meta_info["metrics"]
    return metrics, full_weights(w.actor_engine)


def _same_update(
    a: tuple[dict[str, float], dict[str, Tensor]], b: tuple[dict[str, float], dict[str, Tensor]]
) -> bool:
    return a[0] == b[0] and all(torch.equal(a[1][k], v) for k, v in b[1].items())


@pytest.fixture
def single_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")


@pytest.mark.usefixtures("single_rank")
@pytest.mark.parametrize("mode", AGG_MODES)
def test_the_actor_update_ignores_the_tool_positions_columns(mode: AggMode) -> None:
    """Advantages, old / reference / rollout log-probs at the tool positions: the same
    metrics and the same weights after the update, bit for bit."""
    cfg = _actor_cfg(loss_agg_mode=mode)
    t = holed_tensors()
    keys = ["advantages", "old_log_probs", "ref_log_prob", "rollout_log_probs"]
    base = _update(cfg, t)
    assert base[0]["actor/kl_loss"] > 0
    assert base[0]["actor/grad_norm"] > 0
    assert _same_update(_update(cfg, perturbed(t, keys, tool_positions(t))), base)
    # the same perturbation of one model token moves the update (the check can fail)
    for key in ["advantages", "old_log_probs", "ref_log_prob"]:
        moved = _update(cfg, perturbed(t, [key], one_model_position(t)))
        assert moved[0]["actor/grad_norm"] != base[0]["actor/grad_norm"], key
        assert not _same_update(moved, base), key


@pytest.mark.usefixtures("single_rank")
@pytest.mark.parametrize("kl_type", KL_TYPES)
def test_kl_loss_and_entropy_are_means_over_the_model_tokens(kl_type: str) -> None:
    cfg = _actor_cfg(kl_loss_type=kl_type)
    t = holed_tensors()
    w = ActorRolloutRefWorker(cfg, "actor")
    w.init_model()
    out = w.compute_log_prob(proto(t, temperature=1.0))
    log_prob, entropy = col(out, "old_log_probs"), col(out, "entropys")
    metrics = w.update_actor(proto(t, temperature=1.0)).meta_info["metrics"]
    model = t["response_mask"].bool()
    expected_kl = kl_penalty(log_prob[model], t["ref_log_prob"][model], kl_type).mean()
    assert metrics["actor/kl_loss"] == pytest.approx(float(expected_kl), rel=1e-5, abs=1e-7)
    assert metrics["actor/entropy"] == pytest.approx(float(entropy[model].mean()), rel=1e-5)
    # over every real token the means differ: the holes do matter to the check
    real = t["attention_mask"][:, PROMPT_LEN:].bool()
    assert float(entropy[real].mean()) != pytest.approx(float(entropy[model].mean()), rel=1e-5)
    ref_tools = perturbed(t, ["ref_log_prob"], tool_positions(t))
    assert _same_update(_update(cfg, ref_tools), _update(cfg, t))
    moved = _update(cfg, perturbed(t, ["ref_log_prob"], one_model_position(t)))
    assert moved[0]["actor/kl_loss"] != metrics["actor/kl_loss"]


@pytest.mark.usefixtures("single_rank")
def test_tool_token_ids_are_context_of_the_model_tokens() -> None:
    """Other tool tokens (the same mask) change the log-probs of the model tokens after
    them, not before, and so the update."""
    t = holed_tensors()
    tools = tool_positions(t)
    other = dict(t)
    other["responses"] = torch.where(tools, (t["responses"] + 7) % (VOCAB - 2) + 2, t["responses"])
    other["input_ids"] = torch.cat([t["prompts"], other["responses"]], dim=1)
    assert not torch.equal(other["responses"], t["responses"])
    cfg = _actor_cfg()
    w = ActorRolloutRefWorker(cfg, "actor")
    w.init_model()
    before = col(w.compute_log_prob(proto(t, temperature=1.0)), "old_log_probs")
    after = col(w.compute_log_prob(proto(other, temperature=1.0)), "old_log_probs")
    model = t["response_mask"].bool()
    first_tool = torch.where(tools.any(-1), tools.int().argmax(-1), RESP)
    pos = torch.arange(RESP)[None, :]
    earlier = model & (pos < first_tool[:, None])
    later = model & (pos > first_tool[:, None])
    torch.testing.assert_close(after[earlier], before[earlier], rtol=1e-6, atol=1e-6)
    assert int(later.sum()) > 10
    assert bool(((after - before).abs() > 1e-4)[later].all())
    assert not _same_update(_update(cfg, other), _update(cfg, t))


@pytest.mark.usefixtures("single_rank")
def test_a_response_without_tool_tokens_is_the_single_turn_update() -> None:
    """No hole: ``response_mask`` is the response part of ``attention_mask``, and the update
    equals the one without the column (the single-turn path)."""
    t = holed_tensors()
    t["response_mask"] = t["attention_mask"][:, PROMPT_LEN:].clone()
    cfg = _actor_cfg()
    without = {k: v for k, v in t.items() if k != "response_mask"}
    assert _same_update(_update(cfg, t), _update(cfg, without))
    # and a holed mask is another update
    assert not _same_update(_update(cfg, holed_tensors()), _update(cfg, without))


# --- the critic -----------------------------------------------------------------------------


def _critic_update(
    cfg: CriticConfig, t: dict[str, Tensor]
) -> tuple[dict[str, float], dict[str, Tensor]]:
    critic = CriticWorker(cfg)
    critic.init_model()
    metrics = critic.update_critic(proto(t)).meta_info["metrics"]
    return metrics, full_weights(critic.critic_engine)


@pytest.mark.usefixtures("single_rank")
@pytest.mark.parametrize("mode", AGG_MODES)
def test_the_critic_update_ignores_the_tool_positions_returns_and_values(mode: AggMode) -> None:
    cfg = dataclasses.replace(critic_config(mini=ROWS, micro=2), loss_agg_mode=mode)
    t = holed_tensors()
    base = _critic_update(cfg, t)
    assert base[0]["critic/vf_loss"] > 0
    noisy = perturbed(t, ["returns", "values"], tool_positions(t))
    assert _same_update(_critic_update(cfg, noisy), base)
    for key in ["returns", "values"]:
        moved = _critic_update(cfg, perturbed(t, [key], one_model_position(t)))
        assert moved[0]["critic/vf_loss"] != base[0]["critic/vf_loss"], key


# --- the loss functions ---------------------------------------------------------------------


@st.composite
def holed_masks(draw: st.DrawFn, min_ones: int = 1) -> Tensor:
    """A ``[batch, length]`` 0/1 float64 mask with any holes, at least ``min_ones`` ones."""
    batch = draw(st.integers(1, 4))
    length = draw(st.integers(2, 12))
    rows = [draw(st.lists(st.booleans(), min_size=length, max_size=length)) for _ in range(batch)]
    mask = torch.tensor(rows, dtype=torch.float64)
    assume(int(mask.sum()) >= min_ones)
    return mask


def _randn(shape: torch.Size, seed: int, scale: float = 1.0) -> Tensor:
    """float64 normal noise, reproducibly."""
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(shape, generator=gen, dtype=torch.float64)


def _outside(mask: Tensor, base: Tensor, seed: int) -> Tensor:
    """``base`` with large random values where ``mask`` is 0."""
    return torch.where(mask.bool(), base, _randn(base.shape, seed, 1e3).to(base.dtype))


@PROPERTY
@given(mask=holed_masks(), mode=st.sampled_from(AGG_MODES), seed=st.integers(0, 2**16))
def test_the_policy_loss_and_its_metrics_ignore_masked_positions(
    mask: Tensor, mode: str, seed: int
) -> None:
    shape = mask.shape
    old, new, adv = (_randn(shape, seed + k) - 2 * (k < 2) for k in range(3))
    base = compute_policy_loss(old, new, adv, mask, loss_agg_mode=mode)
    noisy = compute_policy_loss(
        _outside(mask, old, seed + 10),
        new,
        _outside(mask, adv, seed + 11),
        mask,
        loss_agg_mode=mode,
    )
    for a, b in zip(base, noisy, strict=True):
        assert torch.equal(a, b)
    # one model token's advantage: the loss is -A times a positive factor, so it moves
    model = mask.bool().nonzero()[0]
    adv[tuple(model)] += 1.0
    assert compute_policy_loss(old, new, adv, mask, loss_agg_mode=mode)[0] != base[0]


def _full_loss(
    logits: Tensor, labels: Tensor, cols: dict[str, Tensor], mask: Tensor, kl: str, mode: str
) -> Tensor:
    """The actor's loss as the workers compose it: PPO, entropy bonus, KL loss."""
    log_prob = logprobs_from_logits(logits, labels)
    pg, *_ = compute_policy_loss(cols["old"], log_prob, cols["adv"], mask, loss_agg_mode=mode)
    entropy = agg_loss(entropy_from_logits(logits), mask, mode)
    kld = agg_loss(kl_penalty(log_prob, cols["ref"], kl), mask, mode)
    return pg - 0.01 * entropy + 0.1 * kld


@PROPERTY
@given(
    mask=holed_masks(),
    mode=st.sampled_from(AGG_MODES),
    kl=st.sampled_from(KL_TYPES),
    seed=st.integers(0, 2**16),
)
def test_the_logits_gradient_is_zero_at_masked_positions(
    mask: Tensor, mode: str, kl: str, seed: int
) -> None:
    m = mask.float()
    shape = m.shape
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((*shape, 7), generator=g)
    labels = torch.randint(0, 7, shape, generator=g)
    cols = {"old": -2 + _randn(shape, seed + 1), "ref": -2 + _randn(shape, seed + 2)}
    cols["adv"] = _randn(shape, seed + 3)
    noisy = {k: _outside(m, v, seed + 10 + i) for i, (k, v) in enumerate(cols.items())}

    grads = []
    for c in (cols, noisy):
        x = logits.clone().requires_grad_(True)
        _full_loss(x, labels, c, m, kl, mode).backward()  # type: ignore[no-untyped-call]
        assert x.grad is not None
        grads.append(x.grad)
    assert bool((grads[0][~mask.bool()] == 0).all())
    assert bool((grads[0][mask.bool()] != 0).any())
    assert torch.equal(grads[0], grads[1])


@PROPERTY
@given(mask=holed_masks(), kl=st.sampled_from(KL_TYPES), seed=st.integers(0, 2**16))
def test_kl_and_entropy_aggregate_over_the_model_tokens_only(
    mask: Tensor, kl: str, seed: int
) -> None:
    shape = mask.shape
    logp, ref = -2 + _randn(shape, seed), -2 + _randn(shape, seed + 1)
    logits = _randn(torch.Size((*shape, 5)), seed + 2).float()
    model = mask.bool()
    kl_mean = agg_loss(kl_penalty(logp, ref, kl), mask, "token-mean")
    torch.testing.assert_close(kl_mean, kl_penalty(logp[model], ref[model], kl).mean())
    noisy_ref = _outside(mask, ref, seed + 3)
    assert torch.equal(agg_loss(kl_penalty(logp, noisy_ref, kl), mask, "token-mean"), kl_mean)
    ent = agg_loss(entropy_from_logits(logits), mask, "token-mean")
    expected = entropy_from_logits(logits)[model].mean().to(ent.dtype)
    torch.testing.assert_close(ent, expected, rtol=1e-6, atol=1e-6)
    noise = _randn(logits.shape, seed + 4, 50.0).float()
    noisy_logits = torch.where(model[..., None], logits, noise)
    assert torch.equal(agg_loss(entropy_from_logits(noisy_logits), mask, "token-mean"), ent)


@PROPERTY
@given(mask=holed_masks(), mode=st.sampled_from(AGG_MODES), seed=st.integers(0, 2**16))
def test_the_value_loss_ignores_masked_returns_and_values(
    mask: Tensor, mode: str, seed: int
) -> None:
    shape = mask.shape
    vpreds, returns, values = (_randn(shape, seed + k) for k in range(3))
    base = compute_value_loss(vpreds, returns, values, mask, 0.5, mode)
    noisy = compute_value_loss(
        vpreds, _outside(mask, returns, seed + 3), _outside(mask, values, seed + 4), mask, 0.5, mode
    )
    assert torch.equal(base[0], noisy[0])
    assert torch.equal(base[1], noisy[1])
    model = tuple(mask.bool().nonzero()[0])
    returns[model] += 10.0  # far from both the prediction and its clipped value
    assert compute_value_loss(vpreds, returns, values, mask, 0.5, mode)[0] != base[0]


# --- advantage estimators over holes ----------------------------------------------------------


def _compress(x: Tensor, mask: Tensor) -> Tensor:
    """Each row's masked-in entries moved to its front, the rest 0 (the holes cut out)."""
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        kept = x[i][mask[i].bool()]
        out[i, : len(kept)] = kept
    return out


def _compressed_mask(mask: Tensor) -> Tensor:
    counts = mask.sum(-1, keepdim=True)
    return (torch.arange(mask.shape[1])[None, :] < counts).to(mask.dtype)


def _check_like_compressed(
    estimator: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], mask: Tensor, rewards: Tensor
) -> None:
    """``estimator(rewards, mask)`` on the model positions equals it on the compressed
    sequences, and is 0 elsewhere (advantages and returns)."""
    holed = estimator(rewards, mask)
    packed_mask = _compressed_mask(mask)
    packed = estimator(_compress(rewards, mask), packed_mask)
    for h, p in zip(holed, packed, strict=True):
        torch.testing.assert_close(_compress(h, mask), p)
        assert bool((h[~mask.bool()] == 0).all())


@PROPERTY
@given(mask=holed_masks(min_ones=2), seed=st.integers(0, 2**16), lam=st.sampled_from([0.9, 1.0]))
def test_gae_over_holes_is_gae_with_the_holes_cut_out(mask: Tensor, seed: int, lam: float) -> None:
    rewards, values = _randn(mask.shape, seed), _randn(mask.shape, seed + 1)

    def gae(r: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
        v = values if m is mask else _compress(values, mask)
        return compute_gae_advantage_return(r, v, m, gamma=0.95, lam=lam)

    _check_like_compressed(gae, mask, rewards)


@PROPERTY
@given(mask=holed_masks(min_ones=2), seed=st.integers(0, 2**16), gamma=st.sampled_from([0.9, 1]))
def test_reinforce_plus_plus_over_holes_is_with_the_holes_cut_out(
    mask: Tensor, seed: int, gamma: float
) -> None:
    rewards = _randn(mask.shape, seed)

    def rpp(r: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
        return compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=gamma)

    _check_like_compressed(rpp, mask, rewards)


def test_reinforce_plus_plus_carries_the_return_through_a_hole() -> None:
    # gamma 0.5, mask [1, 0, 1, 1], rewards [0, 5 (a tool token's: ignored), 0, 1]
    #   t3: 1; t2: 0 + 0.5 * 1 = 0.5; t1 (hole): carried, returned as 0; t0: 0.5 * 0.5 = 0.25
    # (restarting after the hole would give t0 a return of 0: the outcome lost for turn 1)
    rewards = torch.tensor([[0.0, 5.0, 0.0, 1.0], [0.0, 0.0, 2.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 0]], dtype=torch.float64)
    _, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    assert returns.tolist() == [[0.25, 0.0, 0.5, 1.0], [0.5, 1.0, 2.0, 0.0]]


@PROPERTY
@given(mask=holed_masks(), seed=st.integers(0, 2**16))
def test_grpo_broadcasts_each_score_over_the_model_tokens_only(mask: Tensor, seed: int) -> None:
    rewards = _randn(mask.shape, seed) * mask
    index = [i % 2 for i in range(mask.shape[0])]

    def grpo(r: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
        return compute_grpo_outcome_advantage(r, m, index)

    _check_like_compressed(grpo, mask, rewards)
    adv, _ = grpo(rewards, mask)
    for i in range(mask.shape[0]):
        row = adv[i][mask[i].bool()]
        if len(row):
            assert bool((row == row[0]).all())
