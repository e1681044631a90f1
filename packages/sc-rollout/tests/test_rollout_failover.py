"""Servers that die or hang: every request is answered exactly once, none lost; the dead
server is restarted through the owner's hook and re-synced to the current weights before it
serves again. The servers are processes of their own (``python -m sc_rollout toy``)."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from collections.abc import Iterable, Iterator

import pytest
from _rollout_helpers import in_threads, request, wait_until
from sc_rollout import GenerateResult, RolloutClient, Router, ServerProcess, WeightUpdate
from sc_rollout.errors import NoLiveServerError
from sc_rollout.routing import ServerState, ServerStatus
from sc_rollout.testing import ToyEngine, ToyEngineConfig

pytestmark = pytest.mark.timeout(60)

CONFIG = ToyEngineConfig(token_delay_s=0.01)


class Fleet:
    """Toy-engine server processes by name, and the restart hook a router calls."""

    def __init__(self, config: ToyEngineConfig) -> None:
        self.config = config
        self.processes: dict[str, ServerProcess] = {}
        self.restarted: list[str] = []
        self._lock = threading.Lock()

    def start(self, name: str) -> str:
        process = ServerProcess.toy(self.config, start_timeout_s=20)
        with self._lock:
            self.processes[name] = process
        return process.url

    def restart(self, name: str) -> str:
        """The restart hook: kill what is left of the server, start a new one (a new port)."""
        self.processes[name].kill()
        with self._lock:
            self.restarted.append(name)
        return self.start(name)

    def close(self) -> None:
        for process in self.processes.values():
            process.kill()


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    servers = Fleet(CONFIG)
    try:
        yield servers
    finally:
        servers.close()


def _router(fleet: Fleet, names: Iterable[str], **options: object) -> Router:
    router = Router(restart=fleet.restart, start_timeout_s=20, **options)  # type: ignore[arg-type]
    for name in names:
        router.add_server(fleet.start(name), name=name)
    return router


def _status(router: Router, name: str) -> ServerStatus:
    return next(s for s in router.servers() if s.name == name)


def _expected(version: int, job_seed: int, max_tokens: int) -> tuple[int, ...]:
    """The tokens the servers must give: the same engine in-process, without the delay."""
    engine = ToyEngine(dataclasses.replace(CONFIG, token_delay_s=0.0))
    engine.load_weights(WeightUpdate(version))
    return engine.generate(request(seed=job_seed, max_tokens=max_tokens)).token_ids


def test_a_server_killed_mid_request_loses_nothing_and_comes_back_synced(fleet: Fleet) -> None:
    with _router(fleet, "abc", health_timeout_s=2) as router:
        router.push_weights(WeightUpdate(3))
        jobs = [request(seed=i, max_tokens=20) for i in range(60)]

        def kill_a_busy_server() -> None:
            wait_until(
                lambda: (
                    sum(s.served for s in router.servers()) >= 6
                    and _status(router, "a").in_flight > 0
                ),
                "server a busy",
            )
            fleet.processes["a"].kill()

        killer = threading.Thread(target=kill_a_busy_server)
        killer.start()
        results = in_threads(router.generate, jobs, workers=8)
        killer.join(10)

        # every request answered exactly once, each as if nothing had happened
        assert [r.request_id for r in results] == [j.request_id for j in jobs]
        expected = {seed: _expected(3, seed, 20) for seed in range(60)}
        assert [r.token_ids for r in results] == [expected[i] for i in range(60)]
        assert {(r.finish_reason, r.weight_version) for r in results} == {("length", 3)}
        # the dead server was restarted once and re-synced before serving again
        wait_until(lambda: _status(router, "a").state is ServerState.LIVE, "a back")
        assert fleet.restarted == ["a"]
        status = _status(router, "a")
        assert (status.restarts, status.weight_version) == (1, 3)
        assert status.error is not None
        assert "its health check" in status.error
        assert RolloutClient(fleet.processes["a"].url).weight_version() == 3
        # it serves again, with the current weights only
        again = in_threads(router.generate, [request(seed=i) for i in range(30)], workers=6)
        assert "a" in {r.server for r in again}
        assert {r.weight_version for r in again} == {3}
        assert sum(s.served for s in router.servers()) == 90


def test_the_only_server_killed_mid_request_answers_after_its_restart(fleet: Fleet) -> None:
    with _router(fleet, ["solo"]) as router:
        router.push_weights(WeightUpdate(1))
        out: list[GenerateResult] = []
        runner = threading.Thread(
            target=lambda: out.append(router.generate(request(seed=7, max_tokens=30)))
        )
        runner.start()
        wait_until(lambda: _status(router, "solo").in_flight == 1, "the request in flight")
        fleet.processes["solo"].kill()
        runner.join(30)
        (result,) = out
        assert (result.server, result.weight_version) == ("solo", 1)
        assert result.token_ids == _expected(1, 7, 30)
        assert _status(router, "solo").restarts == 1


def test_a_hung_server_fails_its_health_check_and_its_requests_move(fleet: Fleet) -> None:
    options = {"health_interval_s": 0.2, "health_timeout_s": 0.5}
    with _router(fleet, "ab", **options) as router:
        jobs = [request(seed=i, max_tokens=40) for i in range(4)]
        stopped: list[int] = []

        def stop_a() -> None:
            wait_until(lambda: _status(router, "a").in_flight > 0, "a request on a")
            pid = fleet.processes["a"].pid
            os.kill(pid, signal.SIGSTOP)  # alive, accepting nothing: only health checks tell
            stopped.append(pid)

        stopper = threading.Thread(target=stop_a)
        stopper.start()
        results = in_threads(router.generate, jobs, workers=4)
        stopper.join(10)
        assert stopped
        assert [r.token_ids for r in results] == [_expected(0, i, 40) for i in range(4)]
        wait_until(lambda: _status(router, "a").state is ServerState.LIVE, "a back")
        assert _status(router, "a").restarts == 1
        assert "health check failed" in (_status(router, "a").error or "")


def test_without_a_restart_a_dead_server_stays_out(fleet: Fleet) -> None:
    router = Router(start_timeout_s=20)
    for name in "ab":
        router.add_server(fleet.start(name), name=name)
    with router:
        fleet.processes["a"].kill()
        results = in_threads(router.generate, [request(seed=i) for i in range(8)], workers=4)
        assert {r.server for r in results} == {"b"}
        assert _status(router, "a").state is ServerState.DEAD


def test_a_failed_restart_leaves_the_server_dead_and_says_why(fleet: Fleet) -> None:
    def no_capacity(name: str) -> str:
        raise RuntimeError(f"no capacity for {name} on the node")

    router = Router(restart=no_capacity, start_timeout_s=20)
    router.add_server(fleet.start("solo"), name="solo")
    with router:
        fleet.processes["solo"].kill()
        with pytest.raises(NoLiveServerError, match=r"no live server \(solo: dead\)"):
            router.generate(request())
        status = _status(router, "solo")
        assert status.state is ServerState.DEAD
        assert status.error == ("restart failed: RuntimeError: no capacity for solo on the node")


def test_a_server_restarted_behind_the_routers_back_is_re_synced(fleet: Fleet) -> None:
    router = Router(start_timeout_s=20)
    url = fleet.start("a")
    router.add_server(url, name="a")
    with router:
        router.push_weights(WeightUpdate(2))
        port = int(url.rsplit(":", 1)[1])
        fleet.processes["a"].kill()
        fleet.processes["a"] = ServerProcess.toy(CONFIG, port=port, start_timeout_s=20)
        assert RolloutClient(url).weight_version() == 0
        router.check_health()
        wait_until(
            lambda: (
                _status(router, "a").state is ServerState.LIVE
                and _status(router, "a").weight_version == 2
            ),
            "a re-synced",
        )
        assert RolloutClient(url).weight_version() == 2
        assert router.generate(request()).weight_version == 2
