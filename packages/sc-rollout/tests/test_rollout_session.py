"""Agent sessions: model turns and appended tokens line up in the response, mask and
log-probs; each turn's request carries exactly the sequence so far; a session without tool
tokens is the plain requests it stands for; a router keeps a session on one server; clear
errors; close."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
from _rollout_helpers import toy_servers, wait_until
from sc_rollout import (
    AgentSession,
    GenerateRequest,
    GenerateResult,
    RolloutServer,
    Router,
    SamplingParams,
    ScRolloutError,
    Turn,
    WeightUpdate,
)
from sc_rollout.agents import AppendedTokens
from sc_rollout.errors import (
    PromptTooLongError,
    RolloutRequestError,
    RolloutTypeError,
    SessionStateError,
)
from sc_rollout.testing import ToyEngine, ToyEngineConfig

pytestmark = pytest.mark.timeout(30)

SEEDED = SamplingParams(max_tokens=4, seed=7)
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


class Recording(ToyEngine):
    """A toy engine that keeps every request it is asked to serve."""

    def __init__(self, config: ToyEngineConfig | None = None) -> None:
        super().__init__(config)
        self.requests: list[GenerateRequest] = []

    def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        return super().generate(request)


def _plain(engine: ToyEngine, prompt: tuple[int, ...], sampling: SamplingParams) -> GenerateResult:
    return engine.generate(GenerateRequest(prompt, sampling))


@pytest.fixture
def two() -> Iterator[list[RolloutServer]]:
    with toy_servers(ToyEngineConfig(), ToyEngineConfig()) as servers:
        yield servers


# --- the rollout ----------------------------------------------------------------------------


def test_turns_and_appended_tokens_line_up_in_response_mask_and_logprobs() -> None:
    session = AgentSession(ToyEngine(), [1, 2, 3], session_id="s", sampling=SEEDED)
    first = session.generate()
    tool = session.append_tokens([5, 6])
    second = session.generate(max_tokens=3)
    user = session.append_tokens((9,), role="user")
    third = session.generate(sampling=SamplingParams(max_tokens=2, seed=1))

    assert [len(t.token_ids) for t in (first, second, third)] == [4, 3, 2]
    assert session.prompt_ids == (1, 2, 3)
    assert session.response_ids == (
        (*first.token_ids, 5, 6, *second.token_ids, 9, *third.token_ids)
    )
    assert session.token_ids == session.prompt_ids + session.response_ids
    assert len(session) == 3 + 4 + 2 + 3 + 1 + 2
    assert session.response_mask == (1,) * 4 + (0, 0) + (1,) * 3 + (0,) + (1,) * 2
    assert session.response_logprobs == (
        (*first.logprobs, 0.0, 0.0, *second.logprobs, 0.0, *third.logprobs)
    )
    pairs = zip(session.response_logprobs, session.response_mask, strict=True)
    assert all(lp < 0 for lp, m in pairs if m)
    assert session.segments == [first, tool, second, user, third]
    assert session.turns == [first, second, third]
    assert [t.index for t in session.turns] == [0, 1, 2]
    assert [t.request_id for t in session.turns] == ["s-t0", "s-t1", "s-t2"]
    assert [s.start for s in session.segments] == [0, 4, 6, 9, 10]
    assert tool == AppendedTokens(role="tool", start=4, token_ids=(5, 6))
    assert user.role == "user"
    for turn in session.turns:
        end = turn.start + len(turn.token_ids)
        assert session.response_ids[turn.start : end] == turn.token_ids
        assert session.response_logprobs[turn.start : end] == turn.logprobs
        assert (turn.finish_reason, turn.aborted, turn.server) == ("length", False, None)
        assert (turn.min_weight_version, turn.weight_version) == (0, 0)
    assert (session.weight_version_min, session.weight_version_max) == (0, 0)


def test_to_dict_gives_plain_lists_a_trainer_can_batch() -> None:
    with AgentSession(ToyEngine(), [4], session_id="row", sampling=SEEDED) as session:
        assert session.to_dict()["segments"] == []
        assert session.weight_version_min is None
        turn = session.generate(max_tokens=2)
        session.append_tokens([3])
    row = session.to_dict()
    assert json.loads(json.dumps(row)) == row  # plain values only
    assert row == {
        "session_id": "row",
        "prompt_ids": [4],
        "response_ids": [*turn.token_ids, 3],
        "response_mask": [1, 1, 0],
        "response_logprobs": [*turn.logprobs, 0.0],
        "weight_version_min": 0,
        "weight_version_max": 0,
        "aborted": False,
        "segments": [
            turn.to_dict(),
            {"kind": "appended", "role": "tool", "start": 2, "token_ids": [3]},
        ],
    }
    assert isinstance(row["segments"][0]["token_ids"], list)
    assert row["segments"][0]["kind"] == "model"


def test_each_turn_sends_exactly_the_prompt_and_response_so_far() -> None:
    engine = Recording()
    session = AgentSession(engine, (2, 7), session_id="rec", sampling=SEEDED)
    expected: list[tuple[int, ...]] = []
    for k in range(4):
        expected.append(session.prompt_ids + session.response_ids)
        session.generate(max_tokens=k + 1)
        if k % 2 == 0:
            session.append_tokens([k, k + 1, 15])
    assert [r.prompt_ids for r in engine.requests] == expected
    assert [r.request_id for r in engine.requests] == [f"rec-t{k}" for k in range(4)]
    assert {r.session_id for r in engine.requests} == {"rec"}
    assert [r.sampling.max_tokens for r in engine.requests] == [1, 2, 3, 4]
    assert {r.sampling.seed for r in engine.requests} == {7}
    # the next turn's prompt is the whole sequence, never re-tokenized
    assert expected[-1] + session.turns[-1].token_ids == session.token_ids


def test_the_session_id_is_a_fresh_uuid_by_default() -> None:
    engine = Recording()
    one, other = AgentSession(engine, [1]), AgentSession(engine, [1])
    assert len(one.session_id) == 32
    assert one.session_id != other.session_id
    one.generate(max_tokens=1)
    assert engine.requests[0].session_id == one.session_id
    assert engine.requests[0].request_id == f"{one.session_id}-t0"


# --- what a session equals ------------------------------------------------------------------


def test_one_seeded_turn_equals_one_plain_generate() -> None:
    engine = ToyEngine()
    for prompt in [(1, 2, 3), (0,), (15, 4)]:
        session = AgentSession(engine, prompt, sampling=SamplingParams(max_tokens=9, seed=3))
        turn = session.generate()
        plain = _plain(engine, prompt, SamplingParams(max_tokens=9, seed=3))
        assert (turn.token_ids, turn.logprobs) == (plain.token_ids, plain.logprobs)
        assert turn.finish_reason == plain.finish_reason


def test_seeded_turns_without_tools_equal_the_chained_plain_requests() -> None:
    # The toy engine's sampling depends on the seed and the request alone (not the request
    # id), and restarts from the seed at each request: a seeded session of several turns is
    # the chain of plain requests, each on the sequence so far (not, in general, one request
    # of all the tokens, whose sampler would run on instead of restarting).
    engine = ToyEngine()
    session = AgentSession(engine, (1, 2, 3), sampling=SEEDED)
    sequence: tuple[int, ...] = (1, 2, 3)
    for n in (4, 2, 5):
        turn = session.generate(max_tokens=n)
        plain = _plain(engine, sequence, SamplingParams(max_tokens=n, seed=7))
        assert (turn.token_ids, turn.logprobs) == (plain.token_ids, plain.logprobs)
        sequence += plain.token_ids
    assert session.token_ids == sequence


def test_greedy_turns_without_tools_equal_one_plain_generate_of_all_their_tokens() -> None:
    engine = ToyEngine()
    session = AgentSession(engine, (5, 1), sampling=GREEDY)
    for n in (3, 1, 4):
        session.generate(max_tokens=n)
    plain = _plain(engine, (5, 1), SamplingParams(max_tokens=8, temperature=0.0))
    assert session.response_ids == plain.token_ids
    assert session.response_logprobs == plain.logprobs
    assert session.response_mask == (1,) * 8


def test_tool_tokens_change_what_follows_them() -> None:
    # the bigram toy engine continues from the last token: greedy, the turn after a tool
    # token is the plain completion of that token
    engine = ToyEngine()
    session = AgentSession(engine, (5, 1), sampling=GREEDY)
    session.generate(max_tokens=2)
    session.append_tokens([11])
    turn = session.generate(max_tokens=3)
    assert turn.token_ids == _plain(engine, (11,), SamplingParams(3, temperature=0.0)).token_ids


# --- behind a router ------------------------------------------------------------------------


def test_a_router_keeps_each_session_on_one_server(two: list[RolloutServer]) -> None:
    with Router([s.url for s in two], start_timeout_s=5) as router:
        sessions = [AgentSession(router, [1, 2], sampling=SEEDED) for _ in range(4)]
        for _ in range(3):
            for session in sessions:
                session.generate()
                session.append_tokens([3, 4])
        names = {s.name for s in router.servers()}
        used = set()
        for session in sessions:
            servers = {t.server for t in session.turns}
            assert len(servers) == 1
            (server,) = servers
            assert server in names
            assert router.session_server(session.session_id) == server
            used.add(server)
        # least in flight: with nothing in flight, the first sessions take turns
        assert used == names
        served = {s.name: s.served for s in router.servers()}
        assert sum(served.values()) == 12


def test_a_session_behind_a_router_gives_what_it_gives_in_process(
    two: list[RolloutServer],
) -> None:
    with Router([s.url for s in two], start_timeout_s=5) as router:
        remote = AgentSession(router, [6, 6, 2], session_id="r", sampling=SEEDED)
        local = AgentSession(ToyEngine(), [6, 6, 2], session_id="r", sampling=SEEDED)
        for session in (remote, local):
            session.generate()
            session.append_tokens([8])
            session.generate(max_tokens=3)
        for name in ("response_ids", "response_mask", "response_logprobs"):
            assert getattr(remote, name) == getattr(local, name)
        assert [t.request_id for t in remote.turns] == ["r-t0", "r-t1"]


def test_the_weight_version_span_covers_every_turn(two: list[RolloutServer]) -> None:
    with Router([s.url for s in two], start_timeout_s=5) as router:
        session = AgentSession(router, [1], sampling=SEEDED)
        session.generate()
        router.push_weights(WeightUpdate(3))
        session.append_tokens([2])
        session.generate()
        assert [(t.min_weight_version, t.weight_version) for t in session.turns] == [
            (0, 0),
            (3, 3),
        ]
        assert (session.weight_version_min, session.weight_version_max) == (0, 3)
        row = session.to_dict()
        assert (row["weight_version_min"], row["weight_version_max"]) == (0, 3)


def test_context_overflow_behind_a_router_names_the_session(two: list[RolloutServer]) -> None:
    with Router([s.url for s in two], start_timeout_s=5) as router:
        session = AgentSession(router, [1] * 120, session_id="long", sampling=SEEDED)
        session.generate()
        with pytest.raises(PromptTooLongError, match=r"AgentSession long, turn 1"):
            session.generate(max_tokens=5)


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "error", "match"),
    [
        ([], RolloutRequestError, "prompt_ids must hold at least one token"),
        ([1, "2"], RolloutTypeError, r"prompt_ids\[1\] must be an int"),
        ([1, 2.0], RolloutTypeError, r"prompt_ids\[1\] must be an int"),
        ([True], RolloutTypeError, r"prompt_ids\[0\] must be an int"),
        ([3, -1], RolloutRequestError, r"prompt_ids\[1\] must be >= 0"),
        ("123", RolloutTypeError, "must be a sequence of token ids"),
        (5, RolloutTypeError, "must be a sequence of token ids"),
    ],
)
def test_a_bad_prompt_is_refused(prompt: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        AgentSession(ToyEngine(), prompt, session_id="bad")  # type: ignore[arg-type]


def test_bad_arguments_are_refused_and_change_nothing() -> None:
    engine = ToyEngine()
    with pytest.raises(RolloutTypeError, match="takes a RolloutEngine or a Router, got str"):
        AgentSession("http://x", [1])  # type: ignore[arg-type]
    with pytest.raises(RolloutTypeError, match=r"session_id=\.\.\.\) must be a str"):
        AgentSession(engine, [1], session_id=3)  # type: ignore[arg-type]
    with pytest.raises(RolloutRequestError, match="must not be empty"):
        AgentSession(engine, [1], session_id="")
    with pytest.raises(RolloutTypeError, match="takes a SamplingParams, got dict"):
        AgentSession(engine, [1], sampling={"max_tokens": 2})  # type: ignore[arg-type]

    session = AgentSession(engine, [1], session_id="b")
    with pytest.raises(RolloutRequestError, match="append_tokens\\(token_ids\\) must hold"):
        session.append_tokens([])
    with pytest.raises(RolloutTypeError, match=r"append_tokens\(token_ids\)\[1\] must be an int"):
        session.append_tokens([1, None])  # type: ignore[list-item]
    with pytest.raises(RolloutTypeError, match=r"role=\.\.\.\) must be a non-empty str"):
        session.append_tokens([1], role="")
    with pytest.raises(RolloutRequestError, match=r"max_tokens=\.\.\.\) must be >= 1"):
        session.generate(max_tokens=0)
    with pytest.raises(RolloutTypeError, match=r"max_tokens=\.\.\.\) must be an int"):
        session.generate(max_tokens=2.5)  # type: ignore[arg-type]
    with pytest.raises(RolloutTypeError, match=r"generate\(sampling=\.\.\.\) takes a SamplingP"):
        session.generate(sampling=4)  # type: ignore[arg-type]
    assert (session.response_ids, session.segments) == ((), [])


def test_a_token_outside_the_vocabulary_is_the_engine_s_error_and_changes_nothing() -> None:
    session = AgentSession(ToyEngine(), [1], sampling=SEEDED)
    session.append_tokens([99])  # the session does not know the vocabulary; the engine does
    with pytest.raises(RolloutRequestError, match="token id 99 at position 1"):
        session.generate()
    assert session.turns == []
    assert session.response_ids == (99,)


def test_context_overflow_names_the_session_and_the_turn_and_changes_nothing() -> None:
    engine = ToyEngine(ToyEngineConfig(context_length=12))
    session = AgentSession(engine, [1, 2, 3], session_id="ctx", sampling=SEEDED)
    session.generate()
    session.append_tokens([4, 5])
    before = session.to_dict()
    with pytest.raises(PromptTooLongError, match=r"AgentSession ctx, turn 1: .* 9 tokens") as e:
        session.generate()
    assert isinstance(e.value.__cause__, PromptTooLongError)
    assert "context length is 12" in str(e.value)
    assert session.to_dict() == before
    turn = session.generate(max_tokens=3)  # what fits still runs, as turn 1
    assert (turn.index, turn.request_id, len(session)) == (1, "ctx-t1", 12)


def _turn_in_flight(
    session_id: str,
) -> tuple[ToyEngine, AgentSession, threading.Thread, list[Turn]]:
    """A session on a slow engine whose first turn (500 tokens) a thread runs, in flight on
    return; the thread appends the turn to the list when it ends."""
    engine = ToyEngine(ToyEngineConfig(context_length=600, token_delay_s=0.02))
    session = AgentSession(engine, [1], session_id=session_id, sampling=SamplingParams(500, seed=2))
    out: list[Turn] = []
    thread = threading.Thread(target=lambda: out.append(session.generate()))
    thread.start()
    wait_until(lambda: engine.health().in_flight == 1, "the turn in flight")
    return engine, session, thread, out


def test_an_aborted_turn_keeps_its_tokens_and_is_marked() -> None:
    engine, session, thread, out = _turn_in_flight("ab")
    with pytest.raises(SessionStateError, match="ab-t0 is in flight"):
        session.generate()
    with pytest.raises(SessionStateError, match="append_tokens\\(\\) while turn request"):
        session.append_tokens([1])
    assert engine.abort("ab-t0")
    thread.join(10)
    (turn,) = out
    assert turn.finish_reason == "abort"
    assert turn.aborted
    assert len(turn.token_ids) < 500
    assert session.response_ids == turn.token_ids
    assert session.response_mask == (1,) * len(turn.token_ids)
    assert session.to_dict()["aborted"] is True
    # the session goes on after an aborted turn
    session.append_tokens([3])
    assert session.generate(max_tokens=2).index == 1


# --- close ----------------------------------------------------------------------------------


def test_close_forbids_changes_and_keeps_the_rollout_readable() -> None:
    with AgentSession(ToyEngine(), [1], session_id="c", sampling=SEEDED) as session:
        session.generate()
        assert "closed" not in repr(session)
    assert session.closed
    row = session.to_dict()
    with pytest.raises(SessionStateError, match=r"AgentSession c: generate\(\) after close"):
        session.generate()
    with pytest.raises(SessionStateError, match=r"append_tokens\(\) after close"):
        session.append_tokens([2])
    session.close()  # again: nothing
    assert session.to_dict() == row
    assert "closed" in repr(session)
    assert isinstance(SessionStateError("x"), (ScRolloutError, RuntimeError))


def test_close_aborts_the_turn_in_flight_which_is_kept() -> None:
    _, session, thread, out = _turn_in_flight("cl")
    session.close()
    thread.join(10)
    (turn,) = out
    assert turn.aborted
    assert session.turns == [turn]
    with pytest.raises(SessionStateError):
        session.generate()
