"""AgentLoop: many concurrent agent sessions, each ending exactly once; concurrency bounded;
deadlines and failures recorded, never hung on; groups taken as they finish (streaming);
one server's death moves its sessions' next turns to another server, which is sent the
whole sequence so far (re-prefill), and no session is lost; clear errors."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter

import pytest
from _rollout_helpers import wait_until
from sc_rollout import (
    AgentLoop,
    AgentLoopConfig,
    AgentOutcome,
    AgentSession,
    AgentTask,
    GenerateRequest,
    GenerateResult,
    RolloutServer,
    Router,
    SamplingParams,
    ScRolloutError,
)
from sc_rollout.agents import AGENT_STATUSES
from sc_rollout.errors import (
    AgentLoopClosedError,
    RolloutConfigError,
    RolloutRequestError,
    RolloutTimeoutError,
    RolloutTypeError,
)
from sc_rollout.testing import ToyEngine, ToyEngineConfig

pytestmark = pytest.mark.timeout(60)

SAMPLING = SamplingParams(max_tokens=3, seed=11)
TOOL = (1, 2)


def _tasks(groups: int, per_group: int, prefix: str = "g", data: object = None) -> list[AgentTask]:
    return [
        AgentTask([3, 4, 5], f"{prefix}{g}", data=data, session_id=f"{prefix}{g}-{k}")
        for g in range(groups)
        for k in range(per_group)
    ]


def _flat(groups: list[list[AgentOutcome]]) -> list[AgentOutcome]:
    return [o for group in groups for o in group]


class Recording(ToyEngine):
    """A toy engine that keeps every request it serves."""

    def __init__(self, config: ToyEngineConfig | None = None) -> None:
        super().__init__(config)
        self.requests: list[GenerateRequest] = []
        self._lock = threading.Lock()

    def generate(self, request: GenerateRequest) -> GenerateResult:
        with self._lock:
            self.requests.append(request)
        return super().generate(request)


async def _tool_agent(task: AgentTask, session: AgentSession) -> float:
    """Two turns around a tool call of ``task.data`` seconds (random when None)."""
    await session.agenerate()
    latency = task.data if isinstance(task.data, float) else random.uniform(0.0, 0.05)
    await asyncio.sleep(latency)
    session.append_tokens(TOOL)
    await session.agenerate()
    return float(len(session.response_ids))


def test_64_concurrent_sessions_with_random_tool_latencies_end_exactly_once() -> None:
    engine = Recording(ToyEngineConfig(token_delay_s=0.002))
    tasks = _tasks(16, 4)
    with AgentLoop(engine, _tool_agent, config=AgentLoopConfig(64, 30.0, SAMPLING)) as loop:
        assert loop.submit(tasks) == 64
        groups = loop.take_all(timeout=30)
        assert loop.running == 0
    outcomes = _flat(groups)
    assert Counter(o.task.session_id for o in outcomes) == Counter(t.session_id for t in tasks)
    assert all(o.status == "done" for o in outcomes)
    for group in groups:  # a group is its sessions, in submission order
        assert len({o.task.group for o in group}) == 1
        assert [o.task.session_id for o in group] == sorted(o.task.session_id for o in group)
    for outcome in outcomes:
        rollout = outcome.rollout
        assert outcome.reward == len(rollout["response_ids"]) == 8
        assert rollout["response_mask"] == [1, 1, 1, 0, 0, 1, 1, 1]
        assert rollout["response_ids"][3:5] == list(TOOL)
    # every turn's request was exactly the session's sequence so far
    by_id = {r.request_id: r for r in engine.requests}
    assert len(by_id) == len(engine.requests) == 128
    for outcome in outcomes:
        rollout = outcome.rollout
        sequence = rollout["prompt_ids"] + rollout["response_ids"]
        for segment in rollout["segments"]:
            if segment["kind"] == "model":
                sent = by_id[segment["request_id"]]
                assert (
                    list(sent.prompt_ids)
                    == sequence[: len(rollout["prompt_ids"]) + segment["start"]]
                )
                assert sent.session_id == outcome.task.session_id


def test_sessions_of_one_group_sample_differently_and_a_run_repeats() -> None:
    def run() -> list[list[int]]:
        with AgentLoop(ToyEngine(), _one_turn, config=AgentLoopConfig(8, 10.0, SAMPLING)) as loop:
            loop.submit(_tasks(1, 4))
            return [o.rollout["response_ids"] for o in _flat(loop.take_all(timeout=10))]

    first = run()
    assert len({tuple(r) for r in first}) > 1  # each session has a seed of its own
    assert run() == first  # derived from the config's seed and the session id


async def _one_turn(task: AgentTask, session: AgentSession) -> float:
    await session.agenerate()
    return 1.0


def test_no_more_sessions_run_at_once_than_max_concurrency() -> None:
    running = 0
    peak = 0
    lock = threading.Lock()

    async def agent(task: AgentTask, session: AgentSession) -> float:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        await asyncio.sleep(0.02)
        await session.agenerate()
        with lock:
            running -= 1
        return 0.0

    with AgentLoop(ToyEngine(), agent, config=AgentLoopConfig(4, 10.0, SAMPLING)) as loop:
        loop.submit(_tasks(6, 4))
        assert len(_flat(loop.take_all(timeout=20))) == 24
    assert peak == 4


def test_a_session_past_its_deadline_is_dropped_with_its_reason_and_its_turn_aborted() -> None:
    slow = ToyEngine(ToyEngineConfig(token_delay_s=0.5))  # a turn takes 1.5 s

    async def agent(task: AgentTask, session: AgentSession) -> float:
        if task.data == "slow":
            await session.agenerate()
        return 1.0

    tasks = [AgentTask([1], "quick", data="quick"), AgentTask([1], "stuck", data="slow")]
    started = time.monotonic()
    with AgentLoop(slow, agent, config=AgentLoopConfig(8, 0.3, SAMPLING)) as loop:
        loop.submit(tasks)
        outcomes = {g[0].task.group: g[0] for g in loop.take_all(timeout=10)}
    assert time.monotonic() - started < 1.4  # the stuck turn was aborted, not waited for
    assert outcomes["quick"].ok
    assert outcomes["quick"].reward == 1.0
    stuck = outcomes["stuck"]
    assert (stuck.status, stuck.reward) == ("deadline", None)
    assert "deadline of 0.3 s" in stuck.detail
    assert stuck.rollout["aborted"]  # the turn in flight ended as aborted, its tokens kept


def test_a_failing_agent_is_recorded_as_an_error_and_the_others_finish() -> None:
    async def agent(task: AgentTask, session: AgentSession) -> float:
        await session.agenerate()
        if task.data == "bad":
            raise KeyError("no such tool: 'weather'")
        return 2.0

    tasks = [AgentTask([1], "a", data="bad"), AgentTask([1], "b", data="ok")]
    with AgentLoop(ToyEngine(), agent, config=AgentLoopConfig(sampling=SAMPLING)) as loop:
        loop.submit(tasks)
        outcomes = {g[0].task.group: g[0] for g in loop.take_all(timeout=10)}
    assert outcomes["a"].status == "error"
    assert outcomes["a"].detail == "KeyError: \"no such tool: 'weather'\""
    assert len(outcomes["a"].rollout["response_ids"]) == 3  # what it did is kept
    assert (outcomes["b"].status, outcomes["b"].reward) == ("done", 2.0)


def test_an_agent_returning_none_is_scored_by_the_reward_function() -> None:
    async def agent(task: AgentTask, session: AgentSession) -> float | None:
        await session.agenerate()
        return None

    def reward(task: AgentTask, session: AgentSession) -> float:
        return float(sum(session.response_ids))

    with AgentLoop(
        ToyEngine(), agent, reward=reward, config=AgentLoopConfig(sampling=SAMPLING)
    ) as loop:
        loop.submit(_tasks(1, 1))
        (outcome,) = _flat(loop.take_all(timeout=10))
    assert outcome.reward == sum(outcome.rollout["response_ids"])

    with AgentLoop(ToyEngine(), agent, config=AgentLoopConfig(sampling=SAMPLING)) as loop:
        loop.submit(_tasks(1, 1))
        (outcome,) = _flat(loop.take_all(timeout=10))
    assert outcome.status == "error"
    assert "returned None and the AgentLoop has no reward function" in outcome.detail

    async def nan_agent(task: AgentTask, session: AgentSession) -> float:
        return float("nan")

    with AgentLoop(ToyEngine(), nan_agent) as loop:
        loop.submit(_tasks(1, 1))
        (outcome,) = _flat(loop.take_all(timeout=10))
    assert outcome.status == "error"
    assert "the reward must be finite, got nan" in outcome.detail


def test_streaming_takes_the_first_groups_to_finish_and_the_rest_can_be_discarded() -> None:
    tasks = _tasks(5, 2, data=0.0) + _tasks(1, 2, prefix="slow", data=5.0)
    with AgentLoop(ToyEngine(), _tool_agent, config=AgentLoopConfig(sampling=SAMPLING)) as loop:
        loop.submit(tasks)
        started = time.monotonic()
        first = loop.take_groups(5, timeout=10)
        assert time.monotonic() - started < 2.0  # did not wait for the slow group
        assert {g[0].task.group for g in first} == {f"g{i}" for i in range(5)}
        assert loop.finished_groups() == 0
        assert loop.running == 2
        assert loop.discard() == 1
        assert loop.running == 0
        with pytest.raises(RolloutRequestError, match="1 groups asked, 0 submitted"):
            loop.take_groups(1)
    # cancelled sessions end as "cancelled": submit, cancel, take
    with AgentLoop(ToyEngine(), _tool_agent, config=AgentLoopConfig(sampling=SAMPLING)) as loop:
        loop.submit(_tasks(1, 2, data=5.0))
        time.sleep(0.1)
        assert loop.cancel() == 2
        (group,) = loop.take_all(timeout=5)
    assert [o.status for o in group] == ["cancelled", "cancelled"]
    assert all(s in AGENT_STATUSES for s in ("done", "deadline", "error", "cancelled"))


def test_one_servers_death_moves_its_sessions_next_turns_elsewhere_with_the_whole_sequence() -> (
    None
):
    config = ToyEngineConfig(token_delay_s=0.005)
    engines = [Recording(config), Recording(config)]
    servers = [RolloutServer(e).start() for e in engines]
    killed = threading.Event()

    async def agent(task: AgentTask, session: AgentSession) -> float:
        await session.agenerate()  # the first turn before the death, the others after it
        await asyncio.to_thread(killed.wait, 10)
        for _ in range(3):
            session.append_tokens(TOOL)
            await session.agenerate()
        return 1.0

    try:
        loop_config = AgentLoopConfig(32, 30.0, SAMPLING)
        with (
            Router([s.url for s in servers], start_timeout_s=5.0) as router,
            AgentLoop(router, agent, config=loop_config) as loop,
        ):
            loop.submit(_tasks(8, 4))
            wait_until(lambda: len(engines[0].requests) + len(engines[1].requests) == 32, "turn 1")
            servers[0].stop()  # dead: connection refused from now on
            killed.set()
            outcomes = _flat(loop.take_all(timeout=30))
    finally:
        for server in servers:
            server.stop()
    assert sorted(o.task.session_id for o in outcomes) == sorted(t.session_id for t in _tasks(8, 4))
    assert all(o.status == "done" for o in outcomes), Counter(o.detail for o in outcomes)
    dead = servers[0].url
    moved = 0
    by_id = {r.request_id: r for r in engines[1].requests}
    for outcome in outcomes:
        turns = [s for s in outcome.rollout["segments"] if s["kind"] == "model"]
        assert len(turns) == 4
        assert turns[-1]["server"] != dead  # after the death no turn ran there
        if turns[0]["server"] == dead:
            moved += 1
            rollout = outcome.rollout
            sequence = rollout["prompt_ids"] + rollout["response_ids"]
            last = by_id[turns[-1]["request_id"]]  # the other server got everything so far
            assert (
                list(last.prompt_ids) == sequence[: len(rollout["prompt_ids"]) + turns[-1]["start"]]
            )
    assert moved > 0  # some sessions did start on the server that died


def test_errors_name_the_value() -> None:
    with pytest.raises(RolloutTypeError, match=r"AgentTask\.group must be a non-empty str"):
        AgentTask([1], "")
    with pytest.raises(RolloutRequestError, match="prompt_ids is empty"):
        AgentTask([], "g", session_id="s")
    with pytest.raises(RolloutTypeError, match=r"prompt_ids\[1\] must be an int"):
        AgentTask([1, "x"], "g", session_id="s")  # type: ignore[list-item]
    with pytest.raises(RolloutConfigError, match="max_concurrency must be >= 1, got 0"):
        AgentLoopConfig(max_concurrency=0)
    with pytest.raises(RolloutConfigError, match="deadline_s must be > 0 and finite, got -1"):
        AgentLoopConfig(deadline_s=-1)
    with pytest.raises(RolloutTypeError, match="takes a RolloutEngine or a Router, got int"):
        AgentLoop(3, _one_turn)  # type: ignore[arg-type]
    with AgentLoop(ToyEngine(), _one_turn) as loop:
        loop.submit(_tasks(1, 2))
        with pytest.raises(RolloutRequestError, match="group 'g0' was submitted before"):
            loop.submit([AgentTask([1], "g0")])
        with pytest.raises(RolloutRequestError, match="3 groups asked, 1 submitted"):
            loop.take_groups(3)
        with pytest.raises(RolloutTypeError, match="takes AgentTasks, got str"):
            loop.submit(["g"])  # type: ignore[list-item]
        loop.take_all(timeout=10)
    slow = ToyEngine(ToyEngineConfig(token_delay_s=0.5))
    with AgentLoop(slow, _one_turn) as loop:
        loop.submit(_tasks(1, 1))
        with pytest.raises(RolloutTimeoutError, match=r"0 of 1 groups ended within 0.05 s"):
            loop.take_groups(1, timeout=0.05)
    with pytest.raises(AgentLoopClosedError, match="the loop is closed"):
        loop.submit(_tasks(1, 1))
    assert issubclass(AgentLoopClosedError, ScRolloutError)
    assert issubclass(AgentLoopClosedError, RuntimeError)


def test_a_session_id_is_refused_until_its_group_was_taken() -> None:
    ended = threading.Event()

    async def agent(task: AgentTask, session: AgentSession) -> float:
        await session.agenerate()
        if task.data == "wait":
            await asyncio.to_thread(ended.wait, 10)
        return 1.0

    config = AgentLoopConfig(8, 10.0, SAMPLING)
    with AgentLoop(ToyEngine(), agent, config=config) as loop:
        # "a" ends at once, "b" (same group) waits: the group stays held, "a" ended in it
        loop.submit([AgentTask([3, 4], "g", session_id="a"), AgentTask([3, 4], "g", "wait", "b")])
        wait_until(lambda: loop.running == 1, "session a to end")
        for sid in ("a", "b"):  # ended but held, and running: both refused, by name
            with pytest.raises(RolloutRequestError, match=f"session id '{sid}' .* not taken"):
                loop.submit([AgentTask([3, 4], "other", session_id=sid)])
        with pytest.raises(RolloutRequestError, match="session id 'c' appears twice"):
            loop.submit([AgentTask([1], "h", session_id="c"), AgentTask([1], "i", session_id="c")])
        assert loop.pending_groups() == 1  # a refused batch submits nothing
        ended.set()
        (group,) = loop.take_all(timeout=10)
        assert [o.task.session_id for o in group] == ["a", "b"]
        # once taken, the id is free: a new episode, a new session with the same seed
        loop.submit([AgentTask([3, 4], "g2", session_id="a")])
        (again,) = loop.take_all(timeout=10)
        assert [o.task.session_id for o in again] == ["a"]
        assert again[0].rollout["response_ids"] == group[0].rollout["response_ids"]
        # discarded groups free their ids too
        loop.submit([AgentTask([3, 4], "g3", "wait", "d")])
        assert loop.discard(["g3"]) == 1
        loop.submit([AgentTask([3, 4], "g4", session_id="d")])
        assert [o.task.session_id for o in _flat(loop.take_all(timeout=10))] == ["d"]


def test_concurrent_submits_of_one_session_id_start_it_once() -> None:
    gate = threading.Event()

    async def agent(task: AgentTask, session: AgentSession) -> float:
        await asyncio.to_thread(gate.wait, 10)
        return 1.0

    with AgentLoop(ToyEngine(), agent, config=AgentLoopConfig(64, 10.0, SAMPLING)) as loop:
        barrier = threading.Barrier(8)
        accepted: list[int] = []
        refused: list[str] = []

        def submit(k: int) -> None:
            barrier.wait(5)
            try:
                accepted.append(loop.submit([AgentTask([1], f"g{k}", session_id="same")]))
            except RolloutRequestError as exc:
                refused.append(str(exc))

        threads = [threading.Thread(target=submit, args=(k,)) for k in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        gate.set()
        assert (len(accepted), len(refused)) == (1, 7)
        assert all("session id 'same'" in message for message in refused)
        assert len(_flat(loop.take_all(timeout=10))) == 1
