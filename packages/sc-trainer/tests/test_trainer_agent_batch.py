"""Agent sessions as a training batch: a session without tool tokens is exactly the
single-turn router rollout's row; tool tokens are attended to but masked out of the loss;
dropped sessions are empty rows outside their GRPO group; the reward lands on the last
model token. The tool task's agent on a scripted engine: the call, the tool's tokens, the
score."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch
from _trainer_runs import agent_outcomes
from sc_protocol import DataProto
from sc_rollout import (
    AgentOutcome,
    AgentSession,
    AgentTask,
    GenerateRequest,
    GenerateResult,
)
from sc_rollout.agents import AppendedTokens
from sc_rollout.testing import ToyEngine, ToyEngineConfig
from sc_trainer.agents import agent_token_scores, build_agent_batch
from sc_trainer.config import TaskError
from sc_trainer.rollout import RolloutInputError, RouterSampling
from sc_trainer.rollout._router import build_batch
from sc_trainer.tasks import TOOL_CALC_CHARS, ToolCalcTask, build_char_tokenizer
from sc_workers.algos import compute_grpo_outcome_advantage

pytestmark = pytest.mark.timeout(60)

PROMPT, RESPONSE, PAD = 6, 12, 0


def _run(agent: Any, tasks: list[AgentTask], engine: Any = None) -> list[AgentOutcome]:
    return agent_outcomes(agent, tasks, max_tokens=4, engine=engine)


async def _single_turn(task: AgentTask, session: AgentSession) -> float:
    await session.agenerate()
    return 0.5


async def _with_tool(task: AgentTask, session: AgentSession) -> float:
    await session.agenerate()
    session.append_tokens([7, 8, 9])
    await session.agenerate(max_tokens=2)
    return 1.0


def _tasks(prompts: list[list[int]], n: int = 1) -> list[AgentTask]:
    return [
        AgentTask(p, f"u{i}", data=f"p{i}", session_id=f"u{i}-{k}")
        for i, p in enumerate(prompts)
        for k in range(n)
    ]


def test_a_session_without_tool_tokens_is_the_single_turn_row() -> None:
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    outcomes = _run(_single_turn, _tasks(prompts))
    agent = build_agent_batch(
        outcomes, prompt_length=PROMPT, response_length=RESPONSE, pad_token_id=PAD
    )
    # the router rollout's row of the same prompts and results
    ids = torch.zeros((3, PROMPT), dtype=torch.long)
    mask = torch.zeros((3, PROMPT), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, PROMPT - len(p) :] = torch.tensor(p)
        mask[row, PROMPT - len(p) :] = 1
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
    }
    prompt_batch = DataProto.from_dict(tensors=tensors)
    results = [
        GenerateResult(
            o.task.session_id,
            tuple(o.rollout["response_ids"]),
            tuple(o.rollout["response_logprobs"]),
            "length",
            0,
        )
        for o in outcomes
    ]
    single = build_batch(
        prompt_batch, tensors, results, RouterSampling(response_length=RESPONSE, pad_token_id=PAD)
    )
    assert agent.batch is not None
    assert single.batch is not None
    for key in single.batch.keys():  # noqa: SIM118
        assert torch.equal(agent.batch[key], single.batch[key]), key
    assert list(agent.non_tensor_batch["agent_status"]) == ["done"] * 3
    assert agent.meta_info["weight_version"] == 0


def test_tool_tokens_are_attended_to_but_out_of_the_response_mask() -> None:
    (outcome,) = _run(_with_tool, _tasks([[1, 2, 3]]))
    batch = build_agent_batch(
        [outcome], prompt_length=PROMPT, response_length=RESPONSE, pad_token_id=PAD
    )
    td = batch.batch
    assert td is not None
    model = [1, 1, 1, 1, 0, 0, 0, 1, 1] + [0] * 3
    assert td["response_mask"][0].tolist() == model
    assert td["attention_mask"][0, PROMPT:].tolist() == [1] * 9 + [0] * 3
    assert td["responses"][0, 4:7].tolist() == [7, 8, 9]
    assert td["rollout_log_probs"][0, 4:7].tolist() == [0.0, 0.0, 0.0]
    assert torch.equal(td["input_ids"][0, PROMPT:], td["responses"][0])
    assert td["position_ids"][0].tolist() == [0, 0, 0, 0, 1, 2, *range(3, 15)]
    assert batch.non_tensor_batch["agent_turns"].tolist() == [2]
    scores = agent_token_scores(batch)
    assert scores[0].tolist() == [0.0] * 8 + [1.0] + [0.0] * 3  # on the last model token


def test_dropped_and_too_long_sessions_are_empty_rows_outside_their_group() -> None:
    async def agent(task: AgentTask, session: AgentSession) -> float:
        await session.agenerate()
        if task.data == "bad":
            raise ValueError("the tool crashed")
        if task.data == "long":
            session.append_tokens([1] * 20)
        return 1.0 if task.session_id.endswith("0") else 0.0

    tasks = [AgentTask([1, 2], "g", data=d, session_id=f"g-{k}") for k, d in enumerate(["a", "b"])]
    tasks += [AgentTask([1, 2], "g", data="bad", session_id="g-2")]
    tasks += [AgentTask([1, 2], "g", data="long", session_id="g-3")]
    outcomes = _run(agent, tasks)
    batch = build_agent_batch(
        outcomes, prompt_length=PROMPT, response_length=RESPONSE, pad_token_id=PAD
    )
    td = batch.batch
    assert td is not None
    nt = batch.non_tensor_batch
    assert nt["agent_status"].tolist() == ["done", "done", "error", "too_long"]
    assert nt["agent_reward"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert nt["uid"].tolist()[:2] == ["g", "g"]
    assert len(set(nt["uid"].tolist())) == 3  # each dropped row in a group of its own
    assert td["response_mask"][2:].sum() == 0
    assert td["attention_mask"][2:, PROMPT:].sum() == 0
    scores = agent_token_scores(batch)
    advantages, _ = compute_grpo_outcome_advantage(scores, td["response_mask"], nt["uid"])
    assert advantages[2:].abs().sum() == 0
    # the two kept sessions are normalised against each other only
    kept = advantages[:2].sum(dim=1) / td["response_mask"][:2].sum(dim=1)
    assert kept[0] > 0 > kept[1]
    with pytest.raises(RolloutInputError, match="no outcomes"):
        build_agent_batch([], prompt_length=PROMPT, response_length=RESPONSE, pad_token_id=PAD)
    with pytest.raises(RolloutInputError, match="response_length must be an int >= 1, got 0"):
        build_agent_batch(outcomes, prompt_length=PROMPT, response_length=0, pad_token_id=PAD)


class Scripted(ToyEngine):
    """A toy engine whose turns are given: the next script entry per request."""

    def __init__(self, turns: list[list[int]]) -> None:
        super().__init__(ToyEngineConfig(vocab_size=32))
        self.turns = list(turns)
        self.prompts: list[tuple[int, ...]] = []
        self.requests: list[GenerateRequest] = []

    def generate(self, request: GenerateRequest) -> GenerateResult:
        self.prompts.append(tuple(request.prompt_ids))
        self.requests.append(request)
        tokens = self.turns.pop(0)
        return GenerateResult(request.request_id, tuple(tokens), (-0.5,) * len(tokens), "stop", 0)


@pytest.fixture(scope="module")
def tool_task() -> ToolCalcTask:
    return ToolCalcTask(build_char_tokenizer(TOOL_CALC_CHARS), hint_rate=0.0)


def _ids(task: ToolCalcTask, text: str) -> list[int]:
    return list(task.tokenizer(text, add_special_tokens=False)["input_ids"])


def test_the_tool_task_agent_calls_the_calculator_and_scores_the_last_turn(
    tool_task: ToolCalcTask,
) -> None:
    eos = tool_task.eos_token_id
    engine = Scripted([_ids(tool_task, "["), [*_ids(tool_task, "30"), eos]])
    task = tool_task.tasks(["37*48"], "t", 1)[0]
    session = AgentSession(engine, task.prompt_ids)
    reward = asyncio.run(tool_task.agent(task, session))
    assert reward == 1.0  # the right answer
    assert session.response_mask == (1, 0, 0, 0, 1, 1, 1)
    tool = session.response_ids[1:4]
    assert "".join(tool_task.tokenizer.decode(list(tool)).split()) == "30="  # 37 * 48 % 97
    assert engine.prompts[1] == session.token_ids[: len(task.prompt_ids) + 4]
    # one call per session: the call mark is banned in the answer turn, which ends at eos
    answer_turn = engine.requests[1].sampling
    assert answer_turn.banned_token_ids == (tool_task.call_token_id,)
    assert answer_turn.stop_token_ids == (eos,)
    assert answer_turn.max_tokens == tool_task.turn_tokens
    assert engine.requests[0].sampling.banned_token_ids == ()
    # no call: the first turn is the answer
    engine = Scripted([[*_ids(tool_task, "39"), eos]])
    session = AgentSession(engine, task.prompt_ids)
    assert asyncio.run(tool_task.agent(task, session)) == 0.5
    assert len(session.turns) == 1
    # a call mark after other tokens is no call: that turn is the (wrong) answer
    engine = Scripted([_ids(tool_task, "3[")])
    session = AgentSession(engine, task.prompt_ids)
    assert asyncio.run(tool_task.agent(task, session)) == 0.5
    assert len(session.turns) == 1
    session = AgentSession(Scripted([[*_ids(tool_task, "39"), eos]]), task.prompt_ids)
    assert asyncio.run(tool_task.eval_agent(task, session)) == 0.5


def test_a_hint_session_starts_with_the_call_and_the_answer_as_tool_tokens(
    tool_task: ToolCalcTask,
) -> None:
    hinting = ToolCalcTask(tool_task.tokenizer, hint_rate=0.5)
    tasks = hinting.tasks(["37*48"] * 64, "h", 1)
    hinted = [t for t in tasks if hinting.hinted(t.session_id)]
    assert 16 < len(hinted) < 48  # about half, a fixed draw of each session id
    assert [hinting.hinted(t.session_id) for t in tasks] == [
        hinting.hinted(t.session_id) for t in tasks
    ]
    eos = hinting.eos_token_id
    engine = Scripted([[*_ids(hinting, "30"), eos]])
    session = AgentSession(engine, hinted[0].prompt_ids)
    assert asyncio.run(hinting.agent(hinted[0], session)) == 1.0
    assert session.response_mask == (0, 0, 0, 0, 1, 1, 1)  # the model only answers
    assert "".join(hinting.tokenizer.decode(list(session.response_ids[:4])).split()) == "[30="
    assert engine.requests[0].sampling.banned_token_ids == (hinting.call_token_id,)
    assert [s.role for s in session.segments if isinstance(s, AppendedTokens)] == ["hint"]
    assert tool_task.prompt_length == 10  # bos, "37*48%97="
    assert tool_task.response_length == 3 * 3
    assert tool_task.answer("10*10") == "03"


def test_the_tool_task_splits_and_rejects_bad_input(tool_task: ToolCalcTask) -> None:
    val, train = set(tool_task.val_strings), set(tool_task.train_strings)
    assert not val & train
    assert len(val) + len(train) == 97 * 97
    picked = tool_task.sample_train(8, 0, 3)
    assert np.array_equal(picked, tool_task.sample_train(8, 0, 3))
    with pytest.raises(TaskError, match="is not '<a>\\*<b>'"):
        tool_task.prompt_ids("37+48")
    with pytest.raises(TaskError, match=r"n must be in 1\.\.9153, got 0"):
        tool_task.sample_train(0, 0, 0)
    with pytest.raises(TaskError, match="tool_latency_s must be >= 0"):
        ToolCalcTask(tool_task.tokenizer, tool_latency_s=-1)
    with pytest.raises(TaskError, match=r"hint_rate must be in \[0, 1\), got 1.5"):
        ToolCalcTask(tool_task.tokenizer, hint_rate=1.5)
