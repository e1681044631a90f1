"""The agent batch carries the tokens each turn's sampling banned (``banned_token_ids``),
which the actor renormalises over: the ids on the model tokens of a turn that banned them,
-1 everywhere else, and no column at all when no turn banned a token."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _trainer_runs import agent_outcomes
from sc_rollout import (
    AgentOutcome,
    AgentSession,
    AgentTask,
    SamplingParams,
)
from sc_trainer.agents import build_agent_batch

pytestmark = pytest.mark.timeout(60)

PROMPT, RESPONSE, PAD = 6, 12, 0


def _run(agent: Any, tasks: list[AgentTask]) -> list[AgentOutcome]:
    return agent_outcomes(agent, tasks, max_tokens=3)


def _tasks(n: int) -> list[AgentTask]:
    return [AgentTask([1 + i, 2], f"u{i}", data=f"p{i}", session_id=f"u{i}-0") for i in range(n)]


def _bans(task: AgentTask) -> tuple[int, ...]:
    """Row 0 bans two tokens in its answer turn, row 1 one, row 2 none."""
    return ((3, 4), (5,), ())[int(task.group[1:])]


async def _call_then_answer(task: AgentTask, session: AgentSession) -> float:
    await session.agenerate(max_tokens=2)
    session.append_tokens([7, 8, 9] if task.group == "u0" else [7, 8])  # row 0: 8 tokens
    banned = _bans(task)
    sampling = SamplingParams(max_tokens=3, seed=6, banned_token_ids=banned)
    await session.agenerate(sampling=sampling)
    return 1.0


async def _unbanned(task: AgentTask, session: AgentSession) -> float:
    await session.agenerate(max_tokens=2)
    session.append_tokens([7, 8])
    await session.agenerate()
    return 1.0


def _batch(outcomes: list[AgentOutcome], response_length: int = RESPONSE) -> Any:
    return build_agent_batch(
        outcomes, prompt_length=PROMPT, response_length=response_length, pad_token_id=PAD
    )


def test_a_banned_turn_carries_its_ids_and_every_other_token_minus_one() -> None:
    outcomes = _run(_call_then_answer, _tasks(3))
    batch = _batch(outcomes)
    column = batch.batch["banned_token_ids"]
    assert column.dtype == torch.int64
    assert tuple(column.shape) == (3, RESPONSE, 2)  # K: the most ids any turn banned
    for row, outcome in enumerate(outcomes):
        answer = outcome.rollout["segments"][-1]
        start, end = answer["start"], answer["start"] + len(answer["token_ids"])
        assert answer["kind"] == "model"
        assert end > start
        want = torch.full((RESPONSE, 2), -1, dtype=torch.long)
        ids = _bans(outcome.task)
        want[start:end, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        assert torch.equal(column[row], want), row
        # the sampled tokens are never their own turn's banned ids
        assert not set(answer["token_ids"]) & set(ids)
        # the engine's log-probs of the banned turn are the renormalised ones it sampled
        assert answer["banned_token_ids"] == list(ids)
    # the first turn and the tool tokens ban nothing
    assert bool((column[:, :4] == -1).all())


def test_without_a_ban_there_is_no_column() -> None:
    batch = _batch(_run(_unbanned, _tasks(3)))
    assert "banned_token_ids" not in batch.batch.keys()  # noqa: SIM118


def test_a_dropped_session_bans_nothing() -> None:
    outcomes = _run(_call_then_answer, _tasks(3))
    assert [len(o.rollout["response_ids"]) for o in outcomes] == [8, 7, 7]
    batch = _batch(outcomes, response_length=7)  # row 0, the one that banned 2 ids, is dropped
    assert list(batch.non_tensor_batch["agent_status"]) == ["too_long", "done", "done"]
    column = batch.batch["banned_token_ids"]
    assert tuple(column.shape) == (3, 7, 1)  # K from the kept rows only
    assert bool((column[0] == -1).all())
    assert column[1, 4:].flatten().tolist() == [5, 5, 5]
    assert bool((column[2] == -1).all())
