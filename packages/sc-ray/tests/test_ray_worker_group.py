"""RayWorkerGroup on a local cluster with 8 CPUs and 8 fake GPUs: environment, calls,
errors, deadlines, dead workers, detached workers, shutdown."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest
import ray
from sc_core import (
    CallTimeoutError,
    Worker,
    WorkerDiedError,
    WorkerError,
    WorkerGroupClosedError,
)
from sc_dispatch import Dispatch, Execute, register
from sc_ray import (
    DetachedWorkerError,
    RayClassWithInitArgs,
    RayFuture,
    RayResourcePool,
    RayWorkerGroup,
    WorkerEnvError,
)
from sc_ray import _ray_api as rapi

RAY_INIT: dict[str, Any] = {"num_cpus": 8, "num_gpus": 8, "namespace": "sc_ray_wg_tests"}

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

ENV_KEYS = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_WORLD_SIZE",
    "LOCAL_RANK",
    "WG_PREFIX",
    "WG_BACKEND",
    "RAY_LOCAL_WORLD_SIZE",
    "RAY_LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SC_TEST_EXTRA",
    "SC_TEST_USER",
    "CUDA_VISIBLE_DEVICES",
)


class PeerGone(RuntimeError):
    """An error that says another rank caused it."""

    sc_caused_by_peer = True


class Tiny(Worker):
    """A small worker: reports its environment, echoes, fails and dies on request."""

    def __init__(self, scale: int = 1) -> None:
        super().__init__()
        self.scale = scale

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def environment(self) -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in ENV_KEYS}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def times(self, x: int) -> int:
        return x * self.scale + self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def per_rank(self, x: int) -> int:
        return x + 100 * self.rank

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def only_zero(self, x: int) -> tuple[int, int]:
        return self.rank, x

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def later(self, x: int) -> int:
        return x + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"bad value on rank {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_on(self, rank: int, others_sleep: float) -> int:
        if self.rank == rank:
            os._exit(1)
        time.sleep(others_sleep)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_after_peer(self, rank: int, delay: float) -> int:
        """Rank ``rank`` fails on its own after ``delay`` s; the others at once, with an
        error that says a peer caused it (as a collective's peers do)."""
        if self.rank == rank:
            time.sleep(delay)
            raise ValueError(f"rank {self.rank} failed on its own")
        raise PeerGone(f"rank {self.rank}: the peer's connection closed")

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.ALL)
    async def async_add(self, x: int) -> int:
        await asyncio.sleep(0)
        return x + self.rank


class Broken(Worker):
    def __init__(self) -> None:
        super().__init__()
        if self.rank == 1:
            raise RuntimeError("constructor refuses rank 1")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


def _pool(counts: list[int], **kwargs: Any) -> RayResourcePool:
    return RayResourcePool(counts, use_gpu=False, **kwargs)


def test_environment_names_and_uneven_nodes() -> None:
    pool = _pool([2, 1])
    cls = RayClassWithInitArgs(Tiny, scale=3)
    cls.update_options({"runtime_env": {"env_vars": {"SC_TEST_USER": "kept"}}})
    with RayWorkerGroup(
        pool,
        cls,
        name_prefix="envwg",
        worker_env={"SC_TEST_EXTRA": "yes"},
    ) as wg:
        assert wg.world_size == 3
        envs = wg.environment()
        assert [e["RANK"] for e in envs] == ["0", "1", "2"]
        assert {e["WORLD_SIZE"] for e in envs} == {"3"}
        assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0"]
        assert [e["RAY_LOCAL_WORLD_SIZE"] for e in envs] == ["2", "2", "1"]
        assert {e["WG_BACKEND"] for e in envs} == {"ray"}
        assert {e["WG_PREFIX"] for e in envs} == {"envwg"}
        assert {e["SC_TEST_EXTRA"] for e in envs} == {"yes"}
        assert {e["SC_TEST_USER"] for e in envs} == {"kept"}  # the user's runtime_env is kept
        assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
        assert envs[0]["MASTER_ADDR"] == wg.master_address
        assert wg.worker_names == ["envwgTiny_0:0", "envwgTiny_0:1", "envwgTiny_1:0"]
        assert wg.times(2) == [6, 7, 8]
    assert wg.closed
    assert pool.pgs is None


def test_master_address_given_by_user_is_used() -> None:
    with RayWorkerGroup(
        _pool([2]), RayClassWithInitArgs(Tiny), master_addr="10.1.2.3", master_port=29999
    ) as wg:
        envs = wg.environment()
        assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.1.2.3", "29999")}


def test_reserved_environment_is_refused_before_any_actor_starts() -> None:
    with pytest.raises(WorkerEnvError, match="RANK"):
        RayWorkerGroup(_pool([1]), RayClassWithInitArgs(Tiny), worker_env={"RANK": "5"})
    cls = RayClassWithInitArgs(Tiny)
    cls.update_options({"runtime_env": {"env_vars": {"MASTER_PORT": "1"}}})
    pool = _pool([1])
    with pytest.raises(WorkerEnvError, match="MASTER_PORT"):
        RayWorkerGroup(pool, cls)
    assert pool.pgs is None


def test_calls_blocking_and_not() -> None:
    with RayWorkerGroup(_pool([3]), RayClassWithInitArgs(Tiny), bin_pack=False) as wg:
        assert wg.per_rank([1, 2, 3]) == [1, 102, 203]
        assert wg.only_zero(7) == (0, 7)
        # verl: execute_all / execute_rank_zero are the async forms, returning references.
        assert rapi.get(wg.execute_all("times", 1)) == [1, 2, 3]
        assert wg.execute_all_sync("times", [1, 2, 3]) == [1, 3, 5]
        assert rapi.get([wg.execute_rank_zero("times", 5)]) == [5]
        assert wg.execute_rank_zero_sync("times", 5) == 5
        refs = wg.execute_all_async("times", 10)
        assert rapi.get(refs) == [10, 11, 12]  # Ray references, as in verl
        assert rapi.get([wg.execute_rank_zero_async("times", 4)]) == [4]
        assert wg.async_add([1, 2, 3]) == [1, 3, 5]
        # Non-blocking ONE_TO_ALL calls return plain Ray references, as in verl.
        refs = wg.later(5)
        assert all(rapi.is_object_ref(r) for r in refs)
        assert ray.get(refs) == [5, 6, 7]
        blocking = wg.later.options(blocking=True)
        assert blocking(1) == [1, 2, 3]
        lazy = wg.times.options(blocking=False)(1)
        assert ray.get(lazy) == [1, 2, 3]
        assert not any(isinstance(r, RayFuture) for r in lazy)


def test_errors_deadlines_and_dead_workers() -> None:
    with RayWorkerGroup(_pool([3]), RayClassWithInitArgs(Tiny)) as wg:
        with pytest.raises(WorkerError) as info:
            wg.fail_on(1)
        err = info.value
        assert (err.method, err.rank, err.error_type) == ("fail_on", 1, "ValueError")
        assert "bad value on rank 1" in str(err)
        assert "fail_on" in err.remote_traceback
        assert isinstance(err.cause, ValueError)
        assert wg.times(1) == [1, 2, 3]  # the group still works

        start = time.monotonic()
        with pytest.raises(CallTimeoutError) as timeout:
            wg.sleep.options(timeout=0.5)(3.0)
        assert time.monotonic() - start < 2.5
        assert timeout.value.pending_ranks == (0, 1, 2)
        assert timeout.value.method == "sleep"

        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as died:
            wg.exit_on(1, 30.0)  # the other ranks would answer only after 30 s
        assert time.monotonic() - start < 10
        assert died.value.ranks == (1,)
        assert died.value.method == "exit_on"
        assert wg.alive_ranks() == [0, 2]
        with pytest.raises(WorkerDiedError, match="rank 1"):
            wg.times(1)  # refused at once: rank 1 is known dead


def test_the_error_reported_is_the_failing_ranks_own() -> None:
    """Ranks 0 and 2 fail at once because of rank 1, whose own error comes a second later:
    the call waits for it and reports rank 1's, the others listed."""
    with RayWorkerGroup(_pool([3]), RayClassWithInitArgs(Tiny)) as wg:
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            wg.fail_after_peer(1, 1.0)
        assert info.value.rank == 1
        assert isinstance(info.value.cause, ValueError)
        assert info.value.other_failed_ranks == (0, 2)
        assert time.monotonic() - start < 10
        # with only peer-caused errors in sight for long, the call ends anyway (5 s grace)
        start = time.monotonic()
        with pytest.raises(WorkerError) as only_peers:
            wg.fail_after_peer(1, 20.0)
        assert only_peers.value.rank == 0
        assert time.monotonic() - start < 15


def test_killed_worker_is_reported() -> None:
    with RayWorkerGroup(_pool([2]), RayClassWithInitArgs(Tiny)) as wg:
        wg.start_worker_aliveness_check(0.2, abort_on_death=False)
        pending = wg.sleep.options(blocking=False)(3.0)
        rapi.kill(wg.workers[0])  # during the call
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(pending[0])  # a plain Ray reference raises Ray's own error
        deadline = time.monotonic() + 10
        while wg.dead_ranks != [0]:  # the aliveness thread notices
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with pytest.raises(WorkerDiedError) as died:
            wg.times(1)
        assert died.value.ranks == (0,)
        assert wg.alive_ranks() == [1]


def test_constructor_failure_leaves_nothing_behind() -> None:
    pool = _pool([2])
    with pytest.raises((WorkerError, WorkerDiedError)) as info:
        RayWorkerGroup(pool, RayClassWithInitArgs(Broken))
    assert "__init__" in str(info.value)
    assert "rank 1" in str(info.value)
    assert pool.pgs is None


def test_shutdown_refuses_later_calls() -> None:
    pool = _pool([2])
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(Tiny))
    workers = wg.workers
    wg.shutdown()
    wg.shutdown()  # twice is fine
    with pytest.raises(WorkerGroupClosedError, match="was closed"):
        wg.execute_all("times", 1)
    with pytest.raises(WorkerGroupClosedError, match=r"\.times: the worker group was closed"):
        wg.times(1)
    assert wg.closed
    assert pool.pgs is None
    deadline = time.monotonic() + 10
    while any(rapi.actor_state(w) != "DEAD" for w in workers):
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_the_last_group_in_a_pool_releases_it_and_groups_are_context_managers() -> None:
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=2)
    first = RayWorkerGroup(pool, RayClassWithInitArgs(Tiny))
    with RayWorkerGroup(pool, RayClassWithInitArgs(Tiny, scale=2)) as second:
        assert second.times(1) == [2, 3]
        first.close()
        first.close()  # twice is a no-op
        assert pool.pgs is not None  # still used by the second group
        assert second.times(2) == [4, 5]
    assert [second.closed, pool.pgs] == [True, None]
    with pytest.raises(WorkerGroupClosedError):
        second.times(1)


def test_detached_workers_and_from_detached() -> None:
    pool = _pool([2])
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(Tiny), name_prefix="det", detached=True)
    try:
        again = RayWorkerGroup.from_detached(
            worker_names=wg.worker_names, ray_cls_with_init=RayClassWithInitArgs(Tiny)
        )
        assert again.times(1) == [1, 2]
        by_handle = RayWorkerGroup.from_detached(
            worker_handles=wg.workers, ray_cls_with_init=RayClassWithInitArgs(Tiny)
        )
        assert by_handle.world_size == 2
        with pytest.raises(DetachedWorkerError, match="nope"):
            RayWorkerGroup.from_detached(worker_names=["nope"])
    finally:
        wg.shutdown()


def test_fake_gpus_are_assigned_per_rank() -> None:
    pool = RayResourcePool([4], use_gpu=True, max_colocate_count=1)
    with RayWorkerGroup(pool, RayClassWithInitArgs(Tiny)) as wg:
        devices = [e["CUDA_VISIBLE_DEVICES"] for e in wg.environment()]
        assert len(set(devices)) == 4
        assert all(d is not None and len(d.split(",")) == 1 for d in devices)
