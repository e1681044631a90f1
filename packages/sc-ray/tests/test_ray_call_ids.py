"""Call ids on Ray actors: a second driver's group attached to the same actors replays calls
with a newer epoch and gets the stored outcomes without running them again, a replay of a call
still running waits for it (sync threaded and async actors), and an older driver is fenced off
with a ``StaleDriverError`` that reaches the driver."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from sc_core import CallIds, CallRecord, StaleDriverError, Worker, WorkerError
from sc_dispatch import Dispatch, register
from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

RAY_INIT: dict[str, Any] = {"num_cpus": 4, "namespace": "sc_ray_call_ids_tests"}

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]


class Counting(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.ran = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def step(self, x: int) -> tuple[int, int]:
        self.ran += 1
        return x, self.ran

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def slow(self, seconds: float) -> tuple[int, int]:
        self.ran += 1
        time.sleep(seconds)
        return os.getpid(), self.ran

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail(self) -> None:
        self.ran += 1
        raise ValueError(f"rank {self.rank} fails")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def count(self) -> int:
        return self.ran


class AsyncCounting(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.ran = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def slow(self, seconds: float) -> tuple[int, int]:
        self.ran += 1
        await asyncio.sleep(seconds)
        return os.getpid(), self.ran

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def count(self) -> int:
        return self.ran


def _groups(
    cls: type[Worker], prefix: str, concurrency: int = 1
) -> Iterator[tuple[RayWorkerGroup, RayWorkerGroup]]:
    """A group, and a second driver's group attached to its actors."""
    cia = RayClassWithInitArgs(cls)
    if concurrency > 1:
        cia.update_options({"max_concurrency": concurrency})
    pool = RayResourcePool([2], use_gpu=False)
    wg = RayWorkerGroup(pool, cia, name_prefix=prefix)
    attached = RayWorkerGroup.from_detached(
        worker_handles=wg.workers, ray_cls_with_init=RayClassWithInitArgs(cls)
    )
    try:
        yield wg, attached
    finally:
        attached.shutdown(release_pool=False)
        wg.close()


def _use(wg: RayWorkerGroup, epoch: int, step: int) -> CallIds:
    ids = CallIds(epoch=epoch)
    ids.begin(step)
    wg.use_call_ids(ids)
    return ids


def _counts(wg: RayWorkerGroup) -> list[int]:
    counts: list[int] = wg.execute_all_sync("count")  # a raw call: no id
    return counts


@pytest.fixture
def counting(ray_cluster: None) -> Iterator[tuple[RayWorkerGroup, RayWorkerGroup]]:
    yield from _groups(Counting, "ids_sync")


def test_a_second_driver_gets_the_stored_results(
    counting: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    wg, attached = counting
    _use(wg, 0, 1)
    first = [wg.step(1), wg.step(2)]
    assert first == [[(1, 1), (1, 1)], [(2, 2), (2, 2)]]
    with pytest.raises(WorkerError, match="rank 0 fails"):
        wg.fail()
    _use(attached, 1, 1)
    assert [attached.step(1), attached.step(2)] == first
    with pytest.raises(WorkerError, match="rank 0 fails") as again:
        attached.fail()
    assert isinstance(again.value, ValueError)
    assert _counts(wg) == [3, 3]  # nothing ran again
    assert attached.step(3) == [(3, 4), (3, 4)]
    expected = {
        "step": CallRecord(1, 1, "step#2", True),
        "fail": CallRecord(0, 1, "fail#0", False),
    }
    assert attached.last_calls() == [expected, expected]


def test_an_older_driver_is_fenced_off(counting: tuple[RayWorkerGroup, RayWorkerGroup]) -> None:
    wg, attached = counting
    _use(wg, 0, 1)
    wg.step(1)
    _use(attached, 1, 1)
    attached.step(1)
    with pytest.raises(WorkerError, match="a newer driver re-attached") as info:
        wg.step(2)
    assert isinstance(info.value, StaleDriverError)
    assert "epoch 0" in str(info.value)
    assert "epoch 1" in str(info.value)
    assert "rank 0" in str(info.value)


def _wait_until_running(wg: RayWorkerGroup, timeout_s: float = 30.0) -> None:
    """Until every rank has started its ``slow`` call (asked without a call id)."""
    deadline = time.monotonic() + timeout_s
    while wg.execute_all_sync("count") != [1, 1]:
        assert time.monotonic() < deadline, "the original call did not start"
        time.sleep(0.01)


@pytest.mark.parametrize(("cls", "concurrency"), [(Counting, 4), (Counting, 1), (AsyncCounting, 1)])
def test_a_replay_waits_for_the_running_original(
    ray_cluster: None, cls: type[Worker], concurrency: int
) -> None:
    for wg, attached in _groups(cls, f"ids_wait_{cls.__name__}_{concurrency}", concurrency):
        _use(wg, 0, 1)
        original = wg.slow(1.0)
        if concurrency > 1 or cls is AsyncCounting:
            # calls may start out of order here: the replay must find the original running
            # (one that came first would fence the original off: the newer epoch was seen)
            _wait_until_running(wg)
        _use(attached, 1, 1)
        replay = attached.slow(1.0)
        first = ray.get(original)
        assert ray.get(replay) == first
        assert [ran for _, ran in first] == [1, 1]
        assert _counts(attached) == [1, 1]
