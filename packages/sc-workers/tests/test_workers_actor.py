"""ActorRolloutRefWorker and CriticWorker at world size 1, in this process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from _workers_helpers import (
    PROMPT_LEN,
    RESP_LEN,
    actor_config,
    col,
    critic_config,
    full_weights,
    make_tensors,
    prompt_batch,
    proto,
    rows,
)
from sc_core import ClassWithInitArgs, LocalWorkerGroup, ResourcePool, WorkerError
from sc_protocol import DataProto
from sc_workers import (
    ActorRolloutRefWorker,
    BatchError,
    CriticWorker,
    MissingBatchKeyError,
    NotInitializedError,
    TinyCausalLM,
)
from sc_workers.algos import logprobs_from_logits


@pytest.fixture
def single_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")


@pytest.fixture(scope="module")
def worker() -> Iterator[ActorRolloutRefWorker]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLD_SIZE", "1")
        mp.setenv("RANK", "0")
        w = ActorRolloutRefWorker(actor_config(), "actor_rollout_ref")
        w.init_model()
        yield w


def test_generate_sequences_shapes_and_masks(worker: ActorRolloutRefWorker) -> None:
    prompts = prompt_batch(4, do_sample=False)
    out = worker.generate_sequences(prompts)
    assert out.batch is not None
    responses = col(out, "responses")
    assert responses.shape == (4, RESP_LEN)
    assert torch.equal(col(out, "prompts"), col(prompts, "input_ids"))
    assert torch.equal(col(out, "input_ids"), torch.cat([col(out, "prompts"), responses], 1))
    assert torch.equal(col(out, "attention_mask")[:, PROMPT_LEN:], col(out, "response_mask"))
    pos = col(out, "position_ids")
    steps = pos[:, PROMPT_LEN:] - pos[:, PROMPT_LEN - 1 : PROMPT_LEN]
    assert (steps == torch.arange(1, RESP_LEN + 1)).all()
    assert list(out.non_tensor_batch["uid"]) == ["p0", "p1", "p2", "p3"]
    # greedy decoding is deterministic, and top-k 1 sampling is greedy
    again = worker.generate_sequences(prompt_batch(4, do_sample=False))
    assert again.batch is not None
    assert torch.equal(col(again, "responses"), responses)
    top1 = worker.generate_sequences(prompt_batch(4, top_k=1))
    assert top1.batch is not None
    assert torch.equal(col(top1, "responses"), responses)


def test_generation_stops_at_eos(worker: ActorRolloutRefWorker) -> None:
    # every token is an eos: each response is one token, then padding with mask 0
    out = worker.generate_sequences(prompt_batch(3, eos_token_id=list(range(32)), pad_token_id=0))
    assert out.batch is not None
    assert col(out, "response_mask").tolist() == [[1, 0, 0, 0]] * 3
    assert col(out, "responses")[:, 1:].eq(0).all()


def test_rollout_log_probs_are_the_sampling_models(worker: ActorRolloutRefWorker) -> None:
    """``rollout_log_probs`` (the off-policy ratio's denominator) equal what the actor computes
    for the sampled tokens at the same temperature, and are 0 where the mask is 0."""
    for temperature in (1.0, 1.7):
        out = worker.generate_sequences(prompt_batch(6, temperature=temperature))
        mask = col(out, "response_mask")
        rollout = col(out, "rollout_log_probs")
        assert rollout.shape == mask.shape
        assert rollout.dtype == torch.float32
        assert bool((rollout <= 0).all())
        assert bool(rollout[mask == 0].eq(0).all())
        out.meta_info["temperature"] = temperature
        actor = col(worker.compute_log_prob(out), "old_log_probs")
        torch.testing.assert_close(rollout * mask, actor * mask, rtol=1e-4, atol=1e-5)
    # an eos after one token: the rest of each row is masked, its log-probs are 0
    short = worker.generate_sequences(prompt_batch(3, eos_token_id=list(range(32)), pad_token_id=0))
    assert bool(col(short, "rollout_log_probs")[:, 1:].eq(0).all())
    assert bool(col(short, "rollout_log_probs")[:, 0].lt(0).all())


def test_sampling_settings_are_validated(worker: ActorRolloutRefWorker) -> None:
    with pytest.raises(BatchError, match=r"temperature must be > 0, got 0\.0"):
        worker.generate_sequences(prompt_batch(2, temperature=0.0))
    with pytest.raises(BatchError, match=r"meta_info\['top_p'\] must be a number, got 'x'"):
        worker.generate_sequences(prompt_batch(2, top_p="x"))
    with pytest.raises(BatchError, match="response_length must be a positive int, got 0"):
        worker.generate_sequences(prompt_batch(2, response_length=0))
    short = worker.generate_sequences(prompt_batch(2, max_new_tokens=2))
    assert short.batch is not None
    assert col(short, "responses").shape == (2, 2)


def test_compute_log_prob_matches_the_unsharded_model(worker: ActorRolloutRefWorker) -> None:
    t = make_tensors(4)
    out = worker.compute_log_prob(proto(t, temperature=2.0))
    assert out.meta_info["temperature"] == 2.0
    assert out.batch is not None
    model = TinyCausalLM(worker.config.model)
    model.load_state_dict(full_weights(worker.actor_engine))
    with torch.no_grad():
        logits = model(t["input_ids"], t["attention_mask"], t["position_ids"])
    expected = logprobs_from_logits(logits[:, -RESP_LEN - 1 : -1] / 2.0, t["responses"])
    torch.testing.assert_close(col(out, "old_log_probs"), expected, atol=1e-5, rtol=1e-5)
    assert col(out, "entropys").shape == (4, RESP_LEN)
    assert (col(out, "entropys") > 0).all()


def test_update_actor_changes_the_policy(single_rank: None) -> None:
    w = ActorRolloutRefWorker(actor_config(), "actor_rollout_ref")
    w.init_model()
    t = make_tensors(8)
    before = col(w.compute_log_prob(proto(t)), "old_log_probs")
    ref = col(w.compute_ref_log_prob(proto(t)), "ref_log_prob")
    torch.testing.assert_close(before, ref)  # the reference starts from the same weights
    t["old_log_probs"] = before
    t["ref_log_prob"] = ref
    out = w.update_actor(proto(t, temperature=1.0))
    metrics = out.meta_info["metrics"]
    assert set(metrics) >= {
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/pg_clipfrac_lower",
        "actor/entropy",
        "actor/kl_loss",
        "actor/kl_coef",
        "actor/grad_norm",
        "actor/lr",
    }
    # old == current policy at the first mini-batch: ratio 1, nothing clipped yet
    assert metrics["actor/lr"] == pytest.approx(1e-2)
    assert metrics["actor/grad_norm"] > 0
    after = col(w.compute_log_prob(proto(t)), "old_log_probs")
    assert not torch.allclose(after, before)
    # the reference model does not move
    torch.testing.assert_close(col(w.compute_ref_log_prob(proto(t)), "ref_log_prob"), ref)


def test_worker_errors(worker: ActorRolloutRefWorker, single_rank: None) -> None:
    t = make_tensors(4)
    missing = {k: v for k, v in t.items() if k != "advantages"}
    with pytest.raises(
        MissingBatchKeyError, match=r"update_actor \(rank 0\): the batch has no \['advantages'\]"
    ):
        worker.update_actor(proto(missing))
    with pytest.raises(KeyError):
        worker.compute_log_prob(DataProto.from_dict({"input_ids": t["input_ids"]}))
    with pytest.raises(
        BatchError, match="batch of 6 sequences is not divisible by the per-rank mini-batch size 4"
    ):
        worker.update_actor(proto(rows(make_tensors(6), slice(0, 6))))
    ref_only = ActorRolloutRefWorker(actor_config(), "ref")
    with pytest.raises(NotInitializedError, match="role 'ref' has no actor"):
        ref_only.compute_log_prob(proto(t))
    with pytest.raises(NotInitializedError, match="role 'ref' has no rollout"):
        ref_only.generate_sequences(prompt_batch(2))
    with pytest.raises(NotInitializedError, match="call init_model first"):
        ref_only.compute_ref_log_prob(proto(t))
    actor_only = ActorRolloutRefWorker(actor_config(), "actor")
    with pytest.raises(NotInitializedError, match="role 'actor' has no ref"):
        actor_only.compute_ref_log_prob(proto(t))


def test_critic_values_and_update(single_rank: None) -> None:
    critic = CriticWorker(critic_config())
    with pytest.raises(NotInitializedError, match=r"compute_values \(rank 0\): call init_model"):
        critic.compute_values(proto(make_tensors(2)))
    critic.init_model()
    t = make_tensors(8)
    values = col(critic.compute_values(proto(t)), "values")
    assert values.shape == (8, RESP_LEN)
    assert values[t["response_mask"] == 0].eq(0).all()
    t["values"] = values
    metrics = critic.update_critic(proto(t)).meta_info["metrics"]
    assert set(metrics) == {
        "critic/vf_loss",
        "critic/vf_clipfrac",
        "critic/vpred_mean",
        "critic/grad_norm",
        "critic/lr",
    }
    assert metrics["critic/vf_loss"] > 0
    after = col(critic.compute_values(proto(t)), "values")
    assert not torch.allclose(after, values)
    with pytest.raises(MissingBatchKeyError, match=r"no \['returns'\]"):
        critic.update_critic(proto({k: v for k, v in t.items() if k != "returns"}))


def test_through_a_local_worker_group() -> None:
    """The in-process backend binds the methods and splits by the registered meshes."""
    wg = LocalWorkerGroup(
        ResourcePool([1]),
        ClassWithInitArgs(ActorRolloutRefWorker, config=actor_config(), role="actor_rollout"),
    )
    try:
        wg.init_model()
        gen = wg.generate_sequences(prompt_batch(4, do_sample=False))
        assert col(gen, "responses").shape == (4, RESP_LEN)
        lp = wg.compute_log_prob(gen)
        assert lp.batch["old_log_probs"].shape == (4, RESP_LEN)
        batch = gen.union(lp)
        batch.batch["advantages"] = torch.ones(4, RESP_LEN)
        batch.batch["ref_log_prob"] = batch.batch["old_log_probs"].clone()
        metrics = wg.update_actor(batch).meta_info["metrics"]
        assert "actor/pg_loss" in metrics
    finally:
        wg.close()


def test_in_process_backend_refuses_several_ranks() -> None:
    """Several ranks in one process cannot run collectives: a clear error, not a hang."""
    wg = LocalWorkerGroup(
        ResourcePool([2]), ClassWithInitArgs(CriticWorker, config=critic_config(mini=2))
    )
    try:
        with pytest.raises(WorkerError, match="world size 2 under the in-process backend"):
            wg.init_model()
    finally:
        wg.close()
