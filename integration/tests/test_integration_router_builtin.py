"""The router (``sc_rollout.Router``) over servers of the built-in engine
(``sc_workers.rollout``: a tiny GPT-2, each server a process of its own): sessions stay on
their server; least-in-flight sends fewer requests to a slow server; a server added mid-run
takes requests and a removed one drains; a server killed mid-request is restarted through
the router's hook and re-synced to the current weight version before it serves again, while
every request is answered exactly once.

The same behaviour on toy servers is tested in sc-rollout (``test_rollout_router.py``,
``test_rollout_failover.py``) and, in Ray actors, in ``test_integration_rollout_servers``.
Assertions are on behaviour (who answered, how often, with which weights), never on time.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from sc_rollout import (
    GenerateRequest,
    GenerateResult,
    RolloutClient,
    Router,
    SamplingParams,
    ServerProcess,
    WeightUpdate,
)
from sc_rollout.routing import ServerState
from sc_trainer.tasks import save_tiny_gpt2
from sc_workers.rollout import TorchRolloutEngineConfig, torch_engine_argv

pytestmark = pytest.mark.timeout(120)

#: seconds the slow server waits before each decoding step
SLOW_STEP_S = 0.05
#: one torch thread per server: two servers and the test share two cores
SERVER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
FAST, SLOW = "fast", "slow"


class _Servers:
    """Built-in-engine server processes by name, started at once; :meth:`restart` (the
    router's restart hook) kills a server's process and starts a new one, as its owner
    would."""

    def __init__(self, configs: dict[str, TorchRolloutEngineConfig]) -> None:
        self._configs = configs
        self._lock = threading.Lock()
        self._procs: dict[str, ServerProcess] = {}
        self.restarted: list[str] = []
        with ThreadPoolExecutor(len(configs)) as pool:  # start them all at once
            futures = {name: pool.submit(self._start, c) for name, c in configs.items()}
        failed = [e for f in futures.values() if (e := f.exception()) is not None]
        self._procs.update({n: f.result() for n, f in futures.items() if f.exception() is None})
        if failed:  # stop those that did start
            self.close()
            raise failed[0]

    @staticmethod
    def _start(config: TorchRolloutEngineConfig) -> ServerProcess:
        argv = torch_engine_argv(config, host="127.0.0.1")
        return ServerProcess(argv, env={**os.environ, **SERVER_ENV}, start_timeout_s=90)

    def process(self, name: str) -> ServerProcess:
        with self._lock:
            return self._procs[name]

    def url(self, name: str) -> str:
        return self.process(name).url

    def restart(self, name: str) -> str:
        with self._lock:
            self._procs[name].kill()
            self._procs[name] = self._start(self._configs[name])
            self.restarted.append(name)
            return self._procs[name].url

    def close(self) -> None:
        with self._lock:
            for proc in self._procs.values():
                proc.stop()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_gpt2(tmp_path_factory.mktemp("model") / "tiny-gpt2", context=128)


@pytest.fixture(scope="module")
def servers(model_dir: str) -> Iterator[_Servers]:
    fleet = _Servers(
        {
            FAST: TorchRolloutEngineConfig(model=model_dir),
            SLOW: TorchRolloutEngineConfig(model=model_dir, step_delay_s=SLOW_STEP_S),
        }
    )
    try:
        yield fleet
    finally:
        fleet.close()


def _router(
    servers: _Servers, names: tuple[str, ...], restart: Callable[[str], str] | None = None
) -> Router:
    router = Router(restart=restart, request_timeout_s=90, health_timeout_s=30, start_timeout_s=120)
    for name in names:
        router.add_server(servers.url(name), name=name)
    return router


def _request(
    request_id: str, max_tokens: int = 8, session_id: str | None = None
) -> GenerateRequest:
    sampling = SamplingParams(max_tokens=max_tokens, seed=len(request_id))
    return GenerateRequest((3, 4, 5), sampling, request_id=request_id, session_id=session_id)


def _wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _state(router: Router, name: str) -> ServerState | None:
    """Server ``name``'s state in ``router`` (``None``: the router no longer holds it)."""
    return next((s.state for s in router.servers() if s.name == name), None)


def _answered_once(results: list[GenerateResult], requests: list[GenerateRequest]) -> None:
    """Every request answered exactly once, with a full completion."""
    counts = Counter(r.request_id for r in results)
    assert counts == Counter(r.request_id for r in requests)
    assert set(counts.values()) == {1}
    by_id = {r.request_id: r for r in requests}
    for result in results:
        wanted = by_id[result.request_id].sampling.max_tokens
        assert result.finish_reason == "length", result
        assert len(result.token_ids) == len(result.logprobs) == wanted


def test_sessions_stay_on_their_server(servers: _Servers) -> None:
    sessions = [f"agent-{i}" for i in range(8)]
    seen: dict[str, set[str | None]] = {s: set() for s in sessions}
    with _router(servers, (FAST, SLOW)) as router, ThreadPoolExecutor(len(sessions)) as pool:
        for turn in range(3):  # the sessions' turns interleave, each turn all at once
            requests = [_request(f"{s}-turn{turn}", 4, session_id=s) for s in sessions]
            for request, result in zip(requests, pool.map(router.generate, requests), strict=True):
                assert result.request_id == request.request_id
                assert request.session_id is not None
                seen[request.session_id].add(result.server)
        for session, where in seen.items():
            assert len(where) == 1, f"{session} moved: {where}"
            assert router.session_server(session) in where
        # the sessions were spread over both servers, and each kept its own
        assert {next(iter(where)) for where in seen.values()} == {FAST, SLOW}
        assert sum(s.served for s in router.servers()) == 3 * len(sessions)


def test_least_in_flight_sends_fewer_requests_to_the_slow_server(servers: _Servers) -> None:
    requests = [_request(f"load-{i}", 12) for i in range(40)]
    with _router(servers, (FAST, SLOW)) as router, ThreadPoolExecutor(8) as pool:
        results = list(pool.map(router.generate, requests))
        served = {s.name: s.served for s in router.servers()}
    _answered_once(results, requests)
    by_server = Counter(r.server for r in results)
    assert by_server == Counter(served)
    assert by_server[FAST] + by_server[SLOW] == len(requests)
    # the slow server holds its requests longer, so it is picked less often
    assert by_server[SLOW] >= 1
    assert by_server[FAST] > 0.6 * len(requests), by_server


def test_a_server_added_mid_run_takes_requests(servers: _Servers) -> None:
    requests = [_request(f"add-{i}", 8) for i in range(24)]
    added = threading.Event()
    after_add: list[str] = []  # request ids that started after add_server returned

    def send(request: GenerateRequest) -> GenerateResult:
        if added.is_set():
            after_add.append(request.request_id)
        return router.generate(request)

    with _router(servers, (SLOW,)) as router, ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(send, r) for r in requests]
        _wait_until(lambda: router.servers()[0].served >= 4, "the first answers")
        assert router.add_server(servers.url(FAST), name=FAST) == FAST
        added.set()
        results = [f.result(timeout=90) for f in futures]
        served = {s.name: s.served for s in router.servers()}
    _answered_once(results, requests)
    assert after_add  # the stream went on after the second server came
    later = {r.request_id: r.server for r in results if r.request_id in set(after_add)}
    assert FAST in later.values()
    assert served[FAST] == sum(r.server == FAST for r in results) > 0
    assert served[SLOW] + served[FAST] == len(requests)


def test_a_removed_server_drains(servers: _Servers) -> None:
    requests = [_request(f"drain-{i}", 16) for i in range(24)]
    draining = threading.Event()
    after: list[str] = []  # request ids that started once the slow server was draining

    def send(request: GenerateRequest) -> GenerateResult:
        if draining.is_set():
            after.append(request.request_id)
        return router.generate(request)

    with _router(servers, (FAST, SLOW)) as router, ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(send, r) for r in requests]
        _wait_until(
            lambda: RolloutClient(servers.url(SLOW)).health().in_flight > 0,
            "requests in flight on the slow server",
        )
        router.remove_server(SLOW, wait=False)
        draining.set()
        assert _state(router, SLOW) in (ServerState.DRAINING, None)
        _wait_until(lambda: _state(router, SLOW) is None, "the slow server to drain")
        results = [f.result(timeout=90) for f in futures]
        assert [s.name for s in router.servers()] == [FAST]
        more = [_request(f"drained-{i}", 4) for i in range(6)]
        more_results = list(pool.map(router.generate, more))
    # those in flight on the removed server finished there, once each
    _answered_once(results, requests)
    drained = [r for r in results if r.server == SLOW]
    assert drained
    assert after
    assert all(r.server == FAST for r in results if r.request_id in set(after))
    _answered_once(more_results, more)
    assert {r.server for r in more_results} == {FAST}
    assert RolloutClient(servers.url(SLOW)).health().in_flight == 0


def test_a_server_killed_mid_request_is_restarted_and_resynced(
    servers: _Servers, model_dir: str
) -> None:
    victim = SLOW
    old = servers.process(victim)
    with _router(servers, (FAST, SLOW), restart=servers.restart) as router:
        assert router.push_weights(WeightUpdate(1, model_dir)) == 1
        for name in (FAST, SLOW):
            assert RolloutClient(servers.url(name)).weight_version() == 1
        requests = [_request(f"kill-{i}", 24) for i in range(16)]
        with ThreadPoolExecutor(len(requests)) as pool:
            futures = [pool.submit(router.generate, r) for r in requests]
            _wait_until(
                lambda: RolloutClient(old.url).health().in_flight > 0,
                "requests decoding on the victim",
            )
            old.kill()  # SIGKILL mid-request
            results = [f.result(timeout=90) for f in futures]
        # every request answered exactly once, in full, under version 1 (the cut ones elsewhere)
        _answered_once(results, requests)
        assert all(r.weight_version == r.min_weight_version == 1 for r in results)
        assert sum(s.served for s in router.servers()) == len(requests)
        _wait_until(
            lambda: _state(router, victim) is ServerState.LIVE and servers.restarted == [victim],
            "the victim to come back",
            timeout_s=90,
        )
        status = {s.name: s for s in router.servers()}[victim]
        assert status.restarts == 1
        assert status.error is not None
        new = servers.process(victim)
        assert new.pid != old.pid
        assert not old.alive()
        assert new.alive()
        assert status.url == new.url
        # re-synced to the current version before it took requests again
        assert status.weight_version == 1
        assert RolloutClient(new.url).weight_version() == 1
        # idle servers take turns, so the restarted one answers some of these
        after = [router.generate(_request(f"back-{i}", 4)) for i in range(4)]
        assert victim in {r.server for r in after}
        assert all(r.weight_version == r.min_weight_version == 1 for r in after)
