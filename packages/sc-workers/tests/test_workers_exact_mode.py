"""The exact mode (``rollout.exact_window``): the sampler's log-probs equal the actor's
recomputation bit for bit, and the first PPO ratio of an update is exactly 1; without the mode
the same batches show the difference it removes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _workers_helpers import PROMPT_LEN, RESP_LEN, actor_config, col, make_tensors, prompt_batch
from sc_protocol import DataProto
from sc_workers import (
    ActorRolloutRefConfig,
    ActorRolloutRefWorker,
    BatchError,
    ConfigError,
    MegatronConfig,
    ModelConfig,
    RolloutConfig,
)
from sc_workers.models import TinyCausalLM, window_forward, window_row

WINDOW = PROMPT_LEN + RESP_LEN + 3


def _config(window: int) -> ActorRolloutRefConfig:
    base = actor_config(mini=8, micro=4)
    return dataclasses.replace(
        base,
        rollout=dataclasses.replace(
            base.rollout, exact_window=window, log_prob_micro_batch_size_per_gpu=8
        ),
    )


def _worker(window: int) -> ActorRolloutRefWorker:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLD_SIZE", "1")
        mp.setenv("RANK", "0")
        w = ActorRolloutRefWorker(_config(window), "actor_rollout_ref")
        w.init_model()
    return w


@pytest.fixture(scope="module")
def exact() -> ActorRolloutRefWorker:
    return _worker(WINDOW)


@pytest.fixture(scope="module")
def batched() -> ActorRolloutRefWorker:
    return _worker(0)


def _gap(worker: ActorRolloutRefWorker, seed: int, temperature: float) -> tuple[float, DataProto]:
    """Sample a batch, recompute its log-probs; the largest absolute difference and the batch
    (with ``old_log_probs``)."""
    del seed  # each call draws new samples from the worker's generator
    prompts = prompt_batch(8, temperature=temperature)
    out = worker.generate_sequences(prompts)
    out.meta_info["temperature"] = temperature
    out = out.union(worker.compute_log_prob(out))
    mask = col(out, "response_mask").bool()
    diff = (col(out, "rollout_log_probs") - col(out, "old_log_probs"))[mask]
    return float(diff.abs().max()), out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_sampler_and_the_actor_agree_bit_for_bit(
    exact: ActorRolloutRefWorker, batched: ActorRolloutRefWorker, temperature: float
) -> None:
    gaps = [_gap(exact, seed, temperature)[0] for seed in range(4)]
    assert gaps == [0.0] * 4
    # without the mode the key/value cache, the batch and the padding leave a difference
    plain = [_gap(batched, seed, temperature)[0] for seed in range(4)]
    assert max(plain) > 0.0, plain


def test_the_first_ratio_of_an_update_is_exactly_one(
    exact: ActorRolloutRefWorker, batched: ActorRolloutRefWorker
) -> None:
    """The PPO ratio's denominator is the sampler's log-prob (``old_log_probs`` =
    ``rollout_log_probs``, no recomputation): in the exact mode the update's first forward
    (micro-batches of 4, with gradients) reproduces it, so the ratio is exactly 1."""
    for worker, exactly in ((exact, True), (batched, False)):
        deviations = []
        for _ in range(3):
            _, out = _gap(worker, 0, 1.0)
            n = len(out)
            assert out.batch is not None
            out.batch["old_log_probs"] = col(out, "rollout_log_probs").clone()
            out.batch["advantages"] = torch.linspace(-1.0, 1.0, n)[:, None].expand(n, RESP_LEN)
            out.batch["ref_log_prob"] = col(out, "rollout_log_probs").clone()
            metrics = worker.update_actor(out).meta_info["metrics"]
            deviations.append(metrics["actor/ppo_ratio_first_dev_max"])
        if exactly:
            assert deviations == [0.0, 0.0, 0.0]
        else:
            assert 0.0 < max(deviations) < 1e-4, deviations


def test_window_forward_equals_each_prefix_alone() -> None:
    model = TinyCausalLM(
        ModelConfig(
            vocab_size=32,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            seed=3,
        )
    ).eval()
    t = make_tensors(6)
    with torch.no_grad():
        whole = window_forward(
            model, t["input_ids"], t["attention_mask"], t["position_ids"], WINDOW, "test"
        )
        for row in range(6):
            mask = t["attention_mask"][row].bool()
            first = int(mask.int().argmax())
            tokens = t["input_ids"][row, first:][mask[first:]].tolist()
            for n in range(1, len(tokens) + 1):
                ids, m, pos = window_row(tokens[:n], WINDOW, "test")
                alone = model(ids, m, pos)[0, n - 1]
                assert torch.equal(alone, whole[row, first + n - 1])
            assert bool(whole[row, :first].eq(0).all())  # the left padding's outputs


def test_a_sequence_wider_than_the_window_is_refused() -> None:
    t = make_tensors(2)
    narrow = PROMPT_LEN + RESP_LEN - 1
    with pytest.raises(BatchError, match=r"test: a sequence of 9 tokens does not fit .* 8 tok"):
        window_forward(
            lambda i, m, p: i.float(),
            t["input_ids"],
            t["attention_mask"],
            t["position_ids"],
            narrow,
            "test",
        )
    with pytest.raises(BatchError, match="window must be >= 1 token, got 0"):
        window_forward(
            lambda i, m, p: i.float(),
            t["input_ids"],
            t["attention_mask"],
            t["position_ids"],
            0,
            "test",
        )
    with pytest.raises(BatchError, match="a sequence of 3 tokens does not fit"):
        window_row([1, 2, 3], 2, "test")
    worker = _worker(PROMPT_LEN + 1)
    with pytest.raises(BatchError, match="generate: a sequence of 7 tokens does not fit"):
        worker.generate_sequences(prompt_batch(2))


def test_exact_window_settings_are_checked() -> None:
    for bad in (-1, True):
        with pytest.raises(ConfigError, match=r"rollout.exact_window must be an int >= 0"):
            RolloutConfig(exact_window=bad)
    base = actor_config()
    with pytest.raises(ConfigError, match="not combined with pipeline or sequence parallelism"):
        dataclasses.replace(
            base,
            rollout=dataclasses.replace(base.rollout, exact_window=16),
            actor=dataclasses.replace(
                base.actor,
                strategy="megatron",
                megatron=MegatronConfig(pipeline_model_parallel_size=2),
            ),
            ref=dataclasses.replace(
                base.ref,
                strategy="megatron",
                megatron=MegatronConfig(pipeline_model_parallel_size=2),
            ),
        )
