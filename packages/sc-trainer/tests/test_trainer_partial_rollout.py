"""Partial rollout (``PartialRollout``) on slow toy-engine servers placed by Ray: weights
published while requests are in flight do not wait for them; every trajectory ends once and
records its version span; the staleness bound regenerates (or refuses) over-stale ones."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from sc_protocol import DataProto
from sc_rollout.serving._cli import toy_argv
from sc_rollout.testing import ToyEngineConfig
from sc_trainer.rollout import (
    PartialRollout,
    PendingBatch,
    RolloutInputError,
    RolloutServerFleet,
    RouterRollout,
    RouterSampling,
    StalenessBoundError,
    WeightPublisher,
)
from sc_workers import ModelConfig, RolloutConfig

pytestmark = pytest.mark.timeout(120)

VOCAB = 16
LENGTH = 16
ROWS = 8
#: a trajectory takes LENGTH * 0.05 = 0.8 s: long enough to publish in the middle of it with
#: room on both sides on a loaded machine (see _started)
TOY = ToyEngineConfig(vocab_size=VOCAB, context_length=64, token_delay_s=0.05)


@pytest.fixture(scope="module")
def fleet(ray_cluster: None) -> Iterator[RolloutServerFleet]:
    with RolloutServerFleet(functools.partial(toy_argv, TOY), 2, name_prefix="slow") as fleet:
        yield fleet


@pytest.fixture(scope="module")
def rollout(fleet: RolloutServerFleet) -> Iterator[RouterRollout]:
    # no eos: every trajectory runs its full length, across the update
    sampling = RouterSampling(response_length=LENGTH, eos_token_ids=(), seed=0)
    with RouterRollout(fleet.router, sampling) as rollout:
        yield rollout


def _prompts(rows: int = ROWS) -> DataProto:
    ids = torch.randint(1, VOCAB, (rows, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[::2, :2] = 0
    ids[::2, :2] = 0
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        },
        non_tensors={"row": np.arange(rows)},
    )


def _publish(publisher: WeightPublisher) -> int:
    version = 1 if publisher.version is None else publisher.version + 1
    publisher.publish(version, {"w": torch.full((4,), float(version))})
    return version


def _served(fleet: RolloutServerFleet) -> int:
    return sum(s.served for s in fleet.servers())


def _started(fleet: RolloutServerFleet, pending: PendingBatch) -> None:
    """Wait until every request of ``pending`` is on a server and sampled its first token.

    The servers do not report per-request progress, so the last part is a wait of five
    token delays (0.25 s) after the router handed the last request out: a request that has
    not sampled by then, or one that ended (0.8 s), fails the test's assertions."""
    deadline = time.monotonic() + 10
    while sum(s.in_flight for s in fleet.servers()) < len(pending):
        if time.monotonic() > deadline:
            raise AssertionError("the requests did not reach the servers")
        time.sleep(0.01)
    time.sleep(5 * TOY.token_delay_s)


def test_an_update_during_generation_finishes_every_trajectory_once_within_the_bound(
    fleet: RolloutServerFleet, publisher: WeightPublisher, rollout: RouterRollout
) -> None:
    start = _publish(publisher)
    partial = PartialRollout(rollout, staleness=1)
    served = _served(fleet)
    pending = partial.submit(_prompts(), batch_id="span")
    _started(fleet, pending)
    new = _publish(publisher)
    assert not pending.done()  # the update did not wait for the trajectories
    batch = partial.take(pending, actor_version=new)
    assert _served(fleet) - served == ROWS  # each trajectory answered once
    assert pending.request_ids == [f"span-{row}" for row in range(ROWS)]
    low = batch.non_tensor_batch["weight_version_min"]
    high = batch.non_tensor_batch["weight_version_max"]
    assert low.tolist() == [start] * ROWS
    assert set(high.tolist()) <= {start, new}
    assert (low < high).any()  # continued on the new weights mid-trajectory
    assert (new - low <= partial.staleness).all()
    assert batch.meta_info == {"weight_version": start, "regenerated_rows": 0}
    assert batch.non_tensor_batch["row"].tolist() == list(range(ROWS))
    assert batch.batch is not None
    assert batch.batch["response_mask"].sum(-1).tolist() == [LENGTH] * ROWS


def test_over_stale_trajectories_are_generated_again_at_the_current_weights(
    fleet: RolloutServerFleet, publisher: WeightPublisher, rollout: RouterRollout
) -> None:
    start = _publish(publisher)
    partial = PartialRollout(rollout, staleness=1)  # on_stale="regenerate"
    served = _served(fleet)
    pending = partial.submit(_prompts(), batch_id="stale")
    _started(fleet, pending)
    _publish(publisher)
    newest = _publish(publisher)
    batch = partial.take(pending, actor_version=newest)
    # every first result was two versions old: each row was generated again, once
    assert batch.meta_info["regenerated_rows"] == ROWS
    assert _served(fleet) - served == 2 * ROWS
    assert pending.request_ids == [f"stale-{row}-r1" for row in range(ROWS)]
    low = batch.non_tensor_batch["weight_version_min"]
    assert (newest - low <= 1).all()
    assert low.tolist() == [newest] * ROWS
    assert batch.meta_info["weight_version"] == newest > start


def test_over_stale_trajectories_raise_when_asked(
    fleet: RolloutServerFleet, publisher: WeightPublisher, rollout: RouterRollout
) -> None:
    start = _publish(publisher)
    partial = PartialRollout(rollout, staleness=0, on_stale="raise")
    pending = partial.submit(_prompts(4))
    _started(fleet, pending)
    newest = _publish(publisher)
    with pytest.raises(StalenessBoundError, match=f"started at weight version {start}, more "):
        partial.take(pending, actor_version=newest)
    # the same results within a looser bound are taken as they are
    loose = PartialRollout(rollout, staleness=1, on_stale="raise")
    assert loose.take(pending, actor_version=newest).meta_info["weight_version"] == start


def test_regenerating_needs_weights_within_the_bound(
    fleet: RolloutServerFleet, publisher: WeightPublisher, rollout: RouterRollout
) -> None:
    current = _publish(publisher)
    partial = PartialRollout(rollout, staleness=1)
    pending = partial.submit(_prompts(2))
    with pytest.raises(StalenessBoundError, match="publish newer weights first"):
        partial.take(pending, actor_version=current + 3)


def test_sampling_follows_the_configs_and_meta_info() -> None:
    rc = RolloutConfig(response_length=5, temperature=0.7, top_p=0.9, do_sample=True, seed=3)
    sampling = RouterSampling.from_configs(rc, ModelConfig(eos_token_id=(1, 2), pad_token_id=0))
    assert (sampling.response_length, sampling.eos_token_ids) == (5, (1, 2))
    params = sampling.params("b-0")
    assert (params.max_tokens, params.temperature, params.top_p) == (5, 0.7, 0.9)
    assert params.stop_token_ids == (1, 2)
    assert params.seed == sampling.params("b-0").seed != sampling.params("b-1").seed
    greedy = sampling.with_meta({"do_sample": False, "response_length": 3, "eos_token_id": 7})
    assert greedy.params("x").temperature == 0.0
    assert (greedy.response_length, greedy.eos_token_ids) == (3, (7,))
    with pytest.raises(RolloutInputError, match="top_k"):
        RouterSampling.from_configs(RolloutConfig(top_k=5), ModelConfig())
    with pytest.raises(RolloutInputError, match="top-p only"):
        sampling.with_meta({"top_k": 2})
    with pytest.raises(RolloutInputError, match="response_length must be >= 1"):
        sampling.with_meta({"response_length": 0})


def test_a_row_without_prompt_tokens_is_refused(rollout: RouterRollout) -> None:
    prompts = _prompts(2)
    assert prompts.batch is not None
    prompts.batch["attention_mask"][1] = 0
    with pytest.raises(RolloutInputError, match="row 1 has no prompt token"):
        rollout.submit(prompts)
    with pytest.raises(RolloutInputError, match=r"no tensor \['position_ids'\]"):
        rollout.submit(prompts.select(batch_keys=["input_ids", "attention_mask"]))
