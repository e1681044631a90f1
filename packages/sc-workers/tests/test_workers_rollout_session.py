"""Token parity of an agent session (``sc_rollout.AgentSession``) on the built-in engine: a
tiny GPT-2, three greedy turns with tool tokens appended between them; one transformers
forward over prompt + response recomputes every model token's log-prob, and the tool tokens
are masked out. The nox session installs the ``hf`` extra, so there this must run, not skip.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import pytest
import torch

if os.environ.get("SC_ISOLATED_PACKAGE") == "sc-workers":
    importlib.import_module("transformers")  # the nox session installs sc-workers[hf]
else:
    pytest.importorskip("transformers")

from _workers_rollout_helpers import build_tiny_gpt2
from sc_rollout import AgentSession, SamplingParams, Turn
from sc_rollout.agents import AppendedTokens
from sc_workers import TorchRolloutEngine, TorchRolloutEngineConfig

transformers: Any = importlib.import_module("transformers")

pytestmark = pytest.mark.timeout(120)


def test_a_three_turn_session_with_tool_tokens_keeps_token_parity(tmp_path: Path) -> None:
    model_dir = build_tiny_gpt2(tmp_path)
    tools = [(9, 8), (4, 15, 3)]
    with (
        TorchRolloutEngine(TorchRolloutEngineConfig(model_dir)) as engine,
        AgentSession(
            engine, [2, 3, 4], sampling=SamplingParams(max_tokens=5, temperature=0.0)
        ) as session,
    ):
        for k in range(3):
            session.generate()
            if k < len(tools):
                session.append_tokens(tools[k])

    turns = session.turns
    assert len(turns) == 3
    assert all(t.finish_reason in ("length", "stop") for t in turns)
    mask = session.response_mask
    response = session.response_ids
    assert len(mask) == len(response) == len(session.response_logprobs)
    for segment in session.segments:
        span = range(segment.start, segment.start + len(segment.token_ids))
        assert tuple(response[i] for i in span) == segment.token_ids
        model_token = isinstance(segment, Turn)
        assert all(mask[i] == int(model_token) for i in span)
    assert [s.token_ids for s in session.segments if isinstance(s, AppendedTokens)] == tools
    assert sum(mask) == sum(len(t.token_ids) for t in turns)

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = session.prompt_ids
    with torch.no_grad():
        logits = model(torch.tensor([[*prompt, *response]])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    for i, (token, masked) in enumerate(zip(response, mask, strict=True)):
        if masked:
            expected = float(logprobs[len(prompt) - 1 + i, token])
            assert session.response_logprobs[i] == pytest.approx(expected, abs=1e-5)
            # greedy: each model token is the argmax of the one forward over everything
            assert token == int(logprobs[len(prompt) - 1 + i].argmax())
        else:
            assert session.response_logprobs[i] == 0.0
    row = session.to_dict()
    assert row["response_mask"] == list(mask)
    assert row["response_ids"] == list(response)
