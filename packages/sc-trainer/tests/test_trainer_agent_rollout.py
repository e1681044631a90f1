"""The trainer's agent rollout on toy-engine servers (no Ray, no model): a step's batch has
every row once; streaming takes the first groups and (synchronously) discards the rest; with
a staleness bound the rest feed the next step and a group too far behind is replaced; a
step whose sessions were all dropped is an error that names why; validation scores greedy
sessions."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from sc_rollout import RolloutServer, Router, WeightUpdate
from sc_rollout.testing import ToyEngine, ToyEngineConfig
from sc_trainer import TrainerConfigError
from sc_trainer.agents import AgentRollout, AgentRolloutError
from sc_trainer.tasks import TOOL_CALC_CHARS, ToolCalcTask, build_char_tokenizer

pytestmark = pytest.mark.timeout(120)

VOCAB = 3 + len(TOOL_CALC_CHARS)  # the tiny GPT-2's: pad, eos, bos and the characters


@pytest.fixture(scope="module")
def tokenizer() -> object:
    return build_char_tokenizer(TOOL_CALC_CHARS)


@pytest.fixture
def router() -> Iterator[Router]:
    config = ToyEngineConfig(vocab_size=VOCAB, token_delay_s=0.001)
    servers = [RolloutServer(ToyEngine(config)).start() for _ in range(2)]
    try:
        with Router([s.url for s in servers]) as r:
            yield r
    finally:
        for server in servers:
            server.stop()


def _rollout(router: Router, tokenizer: object, **kwargs: object) -> AgentRollout:
    task = ToolCalcTask(
        tokenizer,
        tool_latency_s=float(kwargs.pop("latency", 0.0)),  # type: ignore[arg-type]
        hint_rate=float(kwargs.pop("hint_rate", 0.0)),  # type: ignore[arg-type]
    )
    options: dict[str, object] = {"prompts_per_step": 4, "n": 2, "seed": 2, **kwargs}
    return AgentRollout(router, task, **options)  # type: ignore[arg-type]


def _wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not true within {timeout_s} s"
        time.sleep(0.01)


def test_a_synchronous_step_has_every_row_once_and_discards_the_extra_groups(
    router: Router, tokenizer: object
) -> None:
    rollout = _rollout(router, tokenizer, extra_groups=2, prompts_per_step=16, n=4)
    try:
        batch, metrics = rollout.batch(1, actor_version=0)
        assert len(batch) == 64
        uids = batch.non_tensor_batch["uid"].tolist()
        assert all(uids.count(u) == 4 for u in set(uids))
        assert list(batch.non_tensor_batch["agent_status"]) == ["done"] * 64
        assert metrics["agent/sessions"] == 64
        assert metrics["agent/dropped"] == 0
        assert metrics["rollout/staleness"] == 0
        assert rollout.loop.running == 0  # the 2 extra groups were discarded
        td = batch.batch
        assert td is not None
        called = batch.non_tensor_batch["agent_turns"] == 2
        mask = td["response_mask"]
        attended = td["attention_mask"][:, -mask.shape[1] :]
        # a session that called the tool has tool tokens: attended to, out of the mask
        assert bool(((attended - mask)[called] == 1).any(dim=1).all())
        assert bool((attended == mask)[~called].all())
        # a second step draws other problems
        again, _ = rollout.batch(2, actor_version=0)
        assert set(again.non_tensor_batch["uid"].tolist()).isdisjoint(uids)
    finally:
        rollout.close()


def test_with_a_staleness_bound_the_extra_groups_feed_the_next_step(
    router: Router, tokenizer: object
) -> None:
    rollout = _rollout(router, tokenizer, extra_groups=4, staleness=1, latency=0.05)
    try:
        rollout.batch(1, actor_version=0)
        assert rollout.loop.running + rollout.loop.finished_groups() * 2 > 0  # kept
        router.push_weights(WeightUpdate(version=1))
        batch, metrics = rollout.batch(2, actor_version=1)
        assert metrics["rollout/staleness"] <= 1
        assert metrics["agent/stale_groups"] == 0
        assert any(u.startswith("s1") for u in batch.non_tensor_batch["uid"].tolist())
        # the groups left from step 2 run at version 1 (every session ended before the next
        # push, so none started under a newer one); two pushes later they are 2 behind
        _wait_until(lambda: rollout.loop.running == 0)
        router.push_weights(WeightUpdate(version=2))
        router.push_weights(WeightUpdate(version=3))
        batch, metrics = rollout.batch(4, actor_version=3)
        assert metrics["agent/stale_groups"] > 0
        assert metrics["rollout/staleness"] <= 1
        assert int(np.min(batch.non_tensor_batch["weight_version_min"])) >= 2
    finally:
        rollout.close()


def test_a_step_whose_sessions_were_all_dropped_names_the_reason(tokenizer: object) -> None:
    slow = ToyEngine(ToyEngineConfig(vocab_size=VOCAB, token_delay_s=0.2))
    server = RolloutServer(slow).start()
    try:
        with Router([server.url]) as router:
            rollout = _rollout(router, tokenizer, deadline_s=0.05)
            try:
                with pytest.raises(
                    AgentRolloutError,
                    match=r"step 1: all 8 agent sessions were dropped "
                    r"\(\{'deadline': 8\}\); first: ran past its deadline of 0.05 s",
                ):
                    rollout.batch(1, actor_version=0)
            finally:
                rollout.close()
    finally:
        server.stop()


def test_validation_scores_one_greedy_session_per_problem(
    router: Router, tokenizer: object
) -> None:
    rollout = _rollout(router, tokenizer)
    try:
        problems = [str(p) for p in rollout.task.val_strings[:6]]
        batch = rollout.validation_batch(0, problems)
        assert len(batch) == 6
        assert list(batch.non_tensor_batch["prompt_text"]) == problems
        scores = rollout.task.score_batch(batch).token_scores.sum(dim=-1)
        assert bool(((scores >= 0.0) & (scores <= 1.0)).all())
        repeated = rollout.task.score_batch(rollout.validation_batch(1, problems))
        assert torch.equal(repeated.token_scores.sum(dim=-1), scores)  # greedy: the same answers
    finally:
        rollout.close()


def test_bad_settings_are_refused(router: Router, tokenizer: object) -> None:
    with pytest.raises(TrainerConfigError, match="extra_groups must be an int >= 0, got -1"):
        _rollout(router, tokenizer, extra_groups=-1)
    with pytest.raises(TrainerConfigError, match="n must be an int >= 1, got 0"):
        _rollout(router, tokenizer, n=0)
