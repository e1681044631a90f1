"""Banned tokens: a rollout whose sampling banned tokens (an agent's tool budget) carries a
``banned_token_ids`` column, and the actor's log-probs and entropies are then those of the
distribution the sampler drew from, the model's renormalised over the allowed tokens.

Checked against ``log_softmax`` over the allowed tokens alone (an independent
computation), and, without the column (or with a column that bans nothing), bit for bit
against the actor's unbanned computation.
"""

from __future__ import annotations

import pytest
import torch
from _workers_helpers import PROMPT_LEN, actor_config, col, full_weights, make_tensors, proto
from sc_workers import ActorRolloutRefWorker, BatchError
from sc_workers.algos import ban_logits_, entropy_from_logits, logprobs_from_logits
from sc_workers.workers._ppo import response_head
from torch import Tensor

pytestmark = pytest.mark.timeout(120)

VOCAB = 32


def _banned(rows: int, length: int, seed: int = 0, k: int = 3) -> Tensor:
    """``[rows, length, k]`` int64: at every other position up to ``k`` distinct ids
    (the rest -1), nothing banned elsewhere."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((rows, length, k), -1, dtype=torch.long)
    for r in range(rows):
        for p in range(0, length, 2):
            count = 1 + (r + p) % k
            out[r, p, :count] = torch.randperm(VOCAB, generator=g)[:count]
    return out


def _allowed_reference(logits: Tensor, banned: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Log-probs at ``labels`` and entropies of ``log_softmax`` over the allowed tokens
    only, position by position (no -inf, no fill value)."""
    lp = torch.empty(labels.shape)
    ent = torch.empty(labels.shape)
    for index in torch.cartesian_prod(*(torch.arange(n) for n in labels.shape)).tolist():
        at = tuple(index)
        drop = {int(b) for b in banned[at] if b >= 0}
        keep = torch.tensor([v for v in range(logits.shape[-1]) if v not in drop])
        logp = torch.log_softmax(logits[at].double()[keep], dim=-1)
        lp[at] = float(logp[(keep == labels[at]).nonzero()[0, 0]])
        ent[at] = float(-(logp.exp() * logp).sum())
    return lp, ent


def _labels_not_banned(labels: Tensor, banned: Tensor) -> Tensor:
    """``labels`` moved off any id banned at their own position (a sampler never draws one)."""
    out = labels.clone()
    for index in (banned == labels.unsqueeze(-1)).any(-1).nonzero().tolist():
        at = tuple(index)
        drop = {int(b) for b in banned[at]}
        out[at] = next(v for v in range(VOCAB) if v not in drop)
    return out


def test_banned_log_probs_are_log_softmax_over_the_allowed_tokens() -> None:
    g = torch.Generator().manual_seed(1)
    logits = 3.0 * torch.randn(4, 6, VOCAB, generator=g)
    banned = _banned(4, 6)
    labels = _labels_not_banned(torch.randint(0, VOCAB, (4, 6), generator=g), banned)
    scaled = ban_logits_(logits.clone(), banned, labels)
    got_lp = logprobs_from_logits(scaled, labels)
    got_ent = entropy_from_logits(scaled)
    want_lp, want_ent = _allowed_reference(logits, banned, labels)
    assert torch.allclose(got_lp, want_lp, atol=1e-5)
    assert torch.allclose(got_ent, want_ent, atol=1e-5)
    assert bool(torch.isfinite(got_ent).all())
    # where something is banned the log-prob rises (the banned mass is gone); elsewhere
    # it is the model's own, bit for bit
    own = logprobs_from_logits(logits, labels)
    some = (banned >= 0).any(-1)
    assert bool((got_lp[some] > own[some]).all())
    assert torch.equal(got_lp[~some], own[~some])
    assert torch.equal(entropy_from_logits(logits)[~some], got_ent[~some])


def test_a_column_that_bans_nothing_changes_nothing_and_banned_tokens_get_no_gradient() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 5, VOCAB, generator=g)
    nothing = torch.full((3, 5, 2), -1, dtype=torch.long)
    assert torch.equal(ban_logits_(logits.clone(), nothing), logits)
    leaf = logits.clone().requires_grad_(True)
    banned = _banned(3, 5, seed=3)
    labels = _labels_not_banned(torch.randint(0, VOCAB, (3, 5), generator=g), banned)
    scaled = ban_logits_(leaf / 1.0, banned, labels)
    loss = logprobs_from_logits(scaled, labels).sum() + entropy_from_logits(scaled).sum()
    torch.autograd.backward(loss)
    grad = leaf.grad
    assert grad is not None
    assert bool(torch.isfinite(grad).all())
    index = (banned >= 0).nonzero(as_tuple=True)
    where = (*index[:-1], banned[index])
    assert bool((grad[where] == 0).all())
    assert float(grad.abs().sum()) > 0


def test_bad_banned_columns_are_refused_by_name() -> None:
    logits = torch.zeros(2, 3, VOCAB)
    labels = torch.zeros(2, 3, dtype=torch.long)
    banned = torch.full((2, 3, 1), -1, dtype=torch.long)
    with pytest.raises(BatchError, match="ban_logits_: banned_token_ids must be int64"):
        ban_logits_(logits, banned.int())
    with pytest.raises(BatchError, match=r"ban_logits_: banned_token_ids \(2, 4, 1\)"):
        ban_logits_(logits, torch.full((2, 4, 1), -1, dtype=torch.long))
    banned[1, 2, 0] = VOCAB
    with pytest.raises(BatchError, match=r"hold \[32\], outside -1 \(padding\) and 0\.\.31"):
        ban_logits_(logits, banned)
    banned[1, 2, 0] = 0  # the label itself
    with pytest.raises(BatchError, match=r"the token at position \[1, 2\] is one its own"):
        ban_logits_(logits, banned, labels)
    with pytest.raises(BatchError, match="logits must be floating point"):
        ban_logits_(labels, banned)


# --- the actor ------------------------------------------------------------------------------


@pytest.fixture
def single_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")


def _actor() -> ActorRolloutRefWorker:
    w = ActorRolloutRefWorker(actor_config(mini=4, micro=2), "actor")
    w.init_model()
    return w


def _with_bans(t: dict[str, Tensor], banned: Tensor) -> dict[str, Tensor]:
    out = dict(t)
    out["responses"] = _labels_not_banned(t["responses"], banned)
    out["input_ids"] = torch.cat([t["prompts"], out["responses"]], dim=1)
    out["banned_token_ids"] = banned
    return out


@pytest.mark.usefixtures("single_rank")
def test_the_actors_log_probs_follow_the_column_and_are_unchanged_without_it() -> None:
    t = make_tensors(4)
    length = t["responses"].shape[1]
    banned = _banned(4, length, seed=4)
    t = {k: v for k, v in _with_bans(t, banned).items() if k != "banned_token_ids"}
    w = _actor()
    without = w.compute_log_prob(proto(t, temperature=1.0))
    lp0, ent0 = col(without, "old_log_probs"), col(without, "entropys")
    # the column absent: the model's own log-probs (a forward and log_softmax, as before)
    engine = w.actor_engine
    assert engine is not None
    engine.eval_mode()
    with torch.no_grad():
        full = engine.forward(t["input_ids"], t["attention_mask"], t["position_ids"])
    logits = full[:, PROMPT_LEN - 1 : -1, :].float()
    assert torch.allclose(lp0, logprobs_from_logits(logits, t["responses"]), atol=1e-6)
    # a column that bans nothing: bit for bit the same
    nothing = dict(t, banned_token_ids=torch.full((4, length, 2), -1, dtype=torch.long))
    same = w.compute_log_prob(proto(nothing, temperature=1.0))
    assert torch.equal(col(same, "old_log_probs"), lp0)
    assert torch.equal(col(same, "entropys"), ent0)
    # the column: log_softmax over the allowed tokens, where something is banned
    banned_out = w.compute_log_prob(proto(dict(t, banned_token_ids=banned), temperature=1.0))
    lp1, ent1 = col(banned_out, "old_log_probs"), col(banned_out, "entropys")
    want_lp, want_ent = _allowed_reference(logits, banned, t["responses"])
    assert torch.allclose(lp1, want_lp, atol=1e-5)
    assert torch.allclose(ent1, want_ent, atol=1e-5)
    some = (banned >= 0).any(-1)
    assert bool((lp1[some] > lp0[some]).all())
    assert torch.equal(lp1[~some], lp0[~some])
    # the head the losses (and the pipelined path) use computes the same
    head_lp, head_ent = response_head(t["responses"], 1.0, banned)(full)
    assert torch.allclose(head_lp, lp1, atol=1e-6)
    assert torch.allclose(head_ent, ent1, atol=1e-6)


@pytest.mark.usefixtures("single_rank")
def test_the_actor_update_follows_the_column_and_is_unchanged_without_it() -> None:
    t = make_tensors(4)
    length = t["responses"].shape[1]
    banned = _banned(4, length, seed=5)
    base = {k: v for k, v in _with_bans(t, banned).items() if k != "banned_token_ids"}

    def update(columns: dict[str, Tensor]) -> tuple[dict[str, float], dict[str, Tensor]]:
        w = _actor()
        metrics = w.update_actor(proto(columns, temperature=1.0)).meta_info["metrics"]
        return metrics, full_weights(w.actor_engine)

    plain = update(base)
    nothing = update(dict(base, banned_token_ids=torch.full((4, length, 1), -1)))
    assert plain[0] == nothing[0]
    assert all(torch.equal(plain[1][k], v) for k, v in nothing[1].items())
    banned_run = update(dict(base, banned_token_ids=banned))
    assert banned_run[0]["actor/entropy"] != plain[0]["actor/entropy"]
    assert banned_run[0]["actor/grad_norm"] != plain[0]["actor/grad_norm"]
    assert all(bool(torch.isfinite(v).all()) for v in banned_run[1].values())


@pytest.mark.usefixtures("single_rank")
def test_the_actor_refuses_a_misshapen_column() -> None:
    t = make_tensors(4)
    length = t["responses"].shape[1]
    w = _actor()
    bad = dict(t, banned_token_ids=torch.full((4, length + 1, 1), -1, dtype=torch.long))
    with pytest.raises(BatchError, match=r"compute_log_prob.*'banned_token_ids' must be int64"):
        w.compute_log_prob(proto(bad, temperature=1.0))
    bad = dict(t, banned_token_ids=torch.full((4, length), -1, dtype=torch.long))
    with pytest.raises(BatchError, match=r"update_actor.*'banned_token_ids' must be int64"):
        w.update_actor(proto(bad, temperature=1.0))
