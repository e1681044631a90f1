"""The router over live servers: sticky sessions, least in flight, servers added and drained
at runtime, weights pushed and stamped on results, abort, and clear errors. (Dead servers:
test_rollout_failover.py.)"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from _rollout_helpers import PROPERTY, in_threads, request, toy_servers, wait_until
from hypothesis import given
from hypothesis import strategies as st
from sc_rollout import GenerateResult, RolloutServer, Router, WeightUpdate
from sc_rollout.errors import (
    DuplicateServerError,
    NoLiveServerError,
    PromptTooLongError,
    RolloutConfigError,
    RolloutRequestError,
    RolloutTimeoutError,
    RolloutTypeError,
    RouterClosedError,
    UnknownServerError,
    WeightLoadError,
    WeightVersionError,
)
from sc_rollout.routing import ServerState
from sc_rollout.routing._affinity import AffinityMap, least_loaded
from sc_rollout.testing import ToyEngine, ToyEngineConfig

pytestmark = pytest.mark.timeout(30)

FAST = ToyEngineConfig()
SLOW = ToyEngineConfig(token_delay_s=0.02)


@pytest.fixture
def three() -> Iterator[list[RolloutServer]]:
    with toy_servers(FAST, FAST, FAST) as servers:
        yield servers


def _router(servers: list[RolloutServer], **options: object) -> Router:
    return Router([s.url for s in servers], start_timeout_s=5, **options)  # type: ignore[arg-type]


def _served(router: Router) -> dict[str, int]:
    return {s.name: s.served for s in router.servers()}


# --- the two choices, alone -----------------------------------------------------------------


@PROPERTY
@given(
    st.integers(1, 5),
    st.lists(st.tuples(st.booleans(), st.integers(0, 8), st.sampled_from("abc")), max_size=60),
)
def test_the_session_map_keeps_the_most_recently_used_sessions(
    capacity: int, steps: list[tuple[bool, int, str]]
) -> None:
    sessions = AffinityMap(capacity)
    model: dict[str, str] = {}  # insertion order = least to most recently used
    for is_put, key, server in steps:
        session = f"s{key}"
        if is_put:
            model.pop(session, None)
            model[session] = server
            sessions.put(session, server)
            while len(model) > capacity:
                del model[next(iter(model))]
        else:
            expected = model.pop(session, None)
            if expected is not None:
                model[session] = expected
            assert sessions.get(session) == expected
        assert sessions.items() == list(model.items())
        assert len(sessions) <= capacity


@PROPERTY
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=3),
        st.tuples(st.integers(0, 5), st.integers(0, 99)),
        min_size=1,
    )
)
def test_least_loaded_has_the_fewest_in_flight_then_waited_longest(
    loads: dict[str, tuple[int, int]],
) -> None:
    chosen = least_loaded(loads)
    assert loads[chosen][0] == min(n for n, _ in loads.values())
    assert loads[chosen][1] == min(p for n, p in loads.values() if n == loads[chosen][0])


def test_the_choices_refuse_nonsense() -> None:
    with pytest.raises(RolloutConfigError, match=r"session_capacity must be >= 1, got 0"):
        AffinityMap(0)
    with pytest.raises(RolloutConfigError, match=r"of no servers"):
        least_loaded({})


# --- routing --------------------------------------------------------------------------------


def test_sessions_stick_to_one_server(three: list[RolloutServer]) -> None:
    with _router(three) as router:
        jobs = [request(session=f"s{i % 12}", seed=i) for i in range(60)]
        results = in_threads(router.generate, jobs, workers=6)
        by_session: dict[str, set[str | None]] = {}
        for job, result in zip(jobs, results, strict=True):
            assert job.session_id is not None
            by_session.setdefault(job.session_id, set()).add(result.server)
        assert all(len(servers) == 1 for servers in by_session.values())
        for session, (server,) in by_session.items():
            assert router.session_server(session) == server
        assert len({server for (server,) in by_session.values()}) == 3


def test_the_session_map_is_bounded(three: list[RolloutServer]) -> None:
    with _router(three, session_capacity=2) as router:
        for session in ("a", "b", "c"):
            router.generate(request(session=session))
        assert router.session_server("a") is None
        assert router.session_server("b") is not None
        assert router.session_server("c") is not None


def test_idle_servers_take_turns(three: list[RolloutServer]) -> None:
    with _router(three) as router:
        for i in range(9):
            router.generate(request(seed=i))
        assert sorted(_served(router).values()) == [3, 3, 3]


def test_least_in_flight_gives_a_slow_server_fewer_requests() -> None:
    slow_config = ToyEngineConfig(token_delay_s=0.03)
    with toy_servers(FAST, slow_config) as (fast, slow), _router([fast, slow]) as router:
        results = in_threads(router.generate, [request(seed=i) for i in range(48)], workers=6)
        counts = Counter(r.server for r in results)
        assert counts[slow.url] < counts[fast.url]
        assert counts[slow.url] > 0
        assert all(s.in_flight == 0 for s in router.servers())


def test_a_server_added_mid_run_takes_requests() -> None:
    with toy_servers(SLOW, SLOW) as (first, second), _router([first]) as router:
        done: list[GenerateResult] = []
        jobs = [request(seed=i) for i in range(40)]
        runner = threading.Thread(target=lambda: done.extend(in_threads(router.generate, jobs, 4)))
        runner.start()
        wait_until(lambda: len(done) > 0 or _served(router)[first.url] >= 4, "a few answers")
        assert router.add_server(second.url, name="second") == "second"
        runner.join(20)
        assert len(done) == 40
        assert _served(router)["second"] > 0
        assert {r.server for r in done} == {first.url, "second"}


def test_a_removed_server_drains() -> None:
    with toy_servers(SLOW, FAST) as (busy, spare), _router([busy]) as router:
        held = [request(max_tokens=15, seed=i) for i in range(3)]
        out: list[GenerateResult] = []
        runner = threading.Thread(target=lambda: out.extend(in_threads(router.generate, held, 3)))
        runner.start()
        wait_until(lambda: busy.engine.health().in_flight == 3, "three requests on busy")
        router.add_server(spare.url)
        router.remove_server(busy.url, wait=False)
        assert [s.state for s in router.servers()] == [ServerState.DRAINING, ServerState.LIVE]
        later = in_threads(router.generate, [request(seed=i) for i in range(5)], workers=5)
        assert {r.server for r in later} == {spare.url}
        runner.join(10)
        assert [(r.server, r.finish_reason, len(r.token_ids)) for r in out] == [
            (busy.url, "length", 15)
        ] * 3
        wait_until(lambda: len(router.servers()) == 1, "the drained server to go")
        assert router.servers()[0].name == spare.url


def test_waiting_for_a_drain_has_a_deadline() -> None:
    with toy_servers(SLOW) as (busy,), _router([busy]) as router:
        req = request(max_tokens=100)
        runner = threading.Thread(target=lambda: router.generate(req))
        runner.start()
        wait_until(lambda: busy.engine.health().in_flight == 1, "the request in flight")
        with pytest.raises(
            RolloutTimeoutError, match=r"1 request\(s\) still in flight after 0\.05"
        ):
            router.remove_server(busy.url, timeout_s=0.05)
        # the server stays out, draining; it goes once its request is answered
        assert [s.state for s in router.servers()] == [ServerState.DRAINING]
        assert router.abort(req.request_id)
        runner.join(10)
        assert router.servers() == []


def test_unknown_and_duplicate_servers(three: list[RolloutServer]) -> None:
    with _router(three[:1]) as router:
        with pytest.raises(UnknownServerError) as info:
            router.remove_server("nope")
        assert str(info.value) == (
            f"Router.remove_server('nope'): no such server; the router holds ['{three[0].url}']"
        )
        assert isinstance(info.value, KeyError)
        with pytest.raises(DuplicateServerError, match=r"is already held"):
            router.add_server(three[0].url)
        router.add_server(three[1].url, name="b")
        with pytest.raises(DuplicateServerError, match=r"a server named 'b'"):
            router.add_server(three[2].url, name="b")


def test_a_server_that_never_answers_is_not_added() -> None:
    server = RolloutServer(ToyEngine())
    url = server.url
    server.stop()  # bound, never served: its port refuses
    with Router(start_timeout_s=0.3) as router:
        with pytest.raises(RolloutTimeoutError, match=r"was not healthy within 0\.3 s"):
            router.add_server(url)
        assert router.servers() == []
        with pytest.raises(NoLiveServerError, match=r"no live server \(none\)"):
            router.generate(request())


# --- weights --------------------------------------------------------------------------------


def test_pushed_weights_reach_every_server_and_each_result(
    three: list[RolloutServer], tmp_path: Path
) -> None:
    with _router(three[:2]) as router:
        assert [router.weight_version] == [None]  # (a list: mypy would keep the narrowing)
        assert router.push_weights(WeightUpdate(3)) == 3
        assert [s.weight_version for s in router.servers()] == [3, 3]
        results = in_threads(router.generate, [request(seed=i) for i in range(6)], workers=3)
        assert {r.weight_version for r in results} == {3}
        # a server added later gets the current weights before its first request
        router.add_server(three[2].url, name="late")
        assert three[2].engine.weight_version() == 3
        assert router.generate(request(session="x")).weight_version == 3
        with pytest.raises(
            WeightVersionError, match=r"version=2\) is below the current version, 3"
        ):
            router.push_weights(WeightUpdate(2))
        with pytest.raises(RolloutTypeError, match=r"takes a WeightUpdate, got int"):
            router.push_weights(4)  # type: ignore[arg-type]
        with pytest.raises(WeightLoadError, match=r"missing\.bin"):
            router.push_weights(WeightUpdate(4, str(tmp_path / "missing.bin")))
        assert router.weight_version == 3
        assert [s.state for s in router.servers()] == [ServerState.LIVE] * 3
        assert {s.engine.weight_version() for s in three} == {3}


# --- requests -------------------------------------------------------------------------------


def test_abort_through_the_router() -> None:
    with toy_servers(SLOW) as (slow,), _router([slow]) as router:
        req = request(max_tokens=100)
        out: list[GenerateResult] = []
        runner = threading.Thread(target=lambda: out.append(router.generate(req)))
        runner.start()
        wait_until(lambda: slow.engine.health().in_flight == 1, "the request in flight")
        assert router.abort(req.request_id)
        runner.join(10)
        assert out[0].finish_reason == "abort"
        assert out[0].server == slow.url
        assert not router.abort(req.request_id)


def test_bad_requests_are_raised_not_retried(three: list[RolloutServer]) -> None:
    with _router(three) as router:
        with pytest.raises(PromptTooLongError, match=r"the context length is 128"):
            router.generate(request([1] * 130))
        with pytest.raises(RolloutTypeError, match=r"takes a GenerateRequest, got list"):
            router.generate([1, 2])  # type: ignore[arg-type]
        assert all(s.state is ServerState.LIVE and s.in_flight == 0 for s in router.servers())
        assert sum(_served(router).values()) == 0


def test_a_request_id_runs_once_at_a_time() -> None:
    with toy_servers(SLOW) as (slow,), _router([slow]) as router:
        req = request(max_tokens=100, request_id="twice")
        runner = threading.Thread(target=lambda: router.generate(req))
        runner.start()
        wait_until(lambda: slow.engine.health().in_flight == 1, "the request in flight")
        with pytest.raises(RolloutRequestError, match=r"request id 'twice' is already in flight"):
            router.generate(request(request_id="twice"))
        router.abort("twice")
        runner.join(10)


def test_a_closed_router_refuses_calls(three: list[RolloutServer]) -> None:
    router = _router(three[:1])
    router.close()
    with pytest.raises(RouterClosedError, match=r"the router is closed"):
        router.generate(request())
    with pytest.raises(RouterClosedError):
        router.add_server(three[1].url)
    with pytest.raises(RolloutConfigError, match=r"max_attempts must be >= 1"):
        Router(max_attempts=0)
    with pytest.raises(RolloutTypeError, match=r"restart=\.\.\.\) must be callable"):
        Router(restart="again")  # type: ignore[arg-type]
