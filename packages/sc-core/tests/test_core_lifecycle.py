"""Lifecycle on the in-process backend: close(), context managers, pools released with the
last group that uses them (the Ray backend's twin is sc-ray's test_ray_lifecycle.py)."""

from __future__ import annotations

import threading

import pytest
from _core_fakes import EchoWorker
from sc_core import (
    ClassWithInitArgs,
    LocalWorkerGroup,
    ResourcePool,
    WorkerError,
    WorkerGroupClosedError,
    WorkerGroupError,
    create_colocated_worker_cls,
)


class CountingPool(ResourcePool):
    """A pool that counts how often it is released."""

    def __init__(self, process_on_nodes: list[int]) -> None:
        super().__init__(process_on_nodes)
        self.released = 0

    def release(self) -> None:
        self.released += 1


def _rank_threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"sc-local-{prefix}-")]


def test_close_is_idempotent_and_a_closed_group_refuses_calls() -> None:
    wg = LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(EchoWorker), name_prefix="lc1")
    assert [wg.closed] == [False]
    assert len(_rank_threads("lc1")) == 2
    wg.close()
    wg.close()
    assert wg.closed
    with pytest.raises(WorkerGroupClosedError, match=r"'lc1'.one_to_all: the worker group was"):
        wg.one_to_all(0)
    with pytest.raises(WorkerGroupError):  # the closed error is a WorkerGroupError too
        wg.execute_all_async("one_to_all", 0)
    with pytest.raises(WorkerGroupClosedError):
        wg.execute_rank_zero_sync("one_to_all", 0)
    for thread in _rank_threads("lc1"):
        thread.join(timeout=10)
    assert _rank_threads("lc1") == []


def test_a_group_is_a_context_manager() -> None:
    with LocalWorkerGroup(ResourcePool([1]), ClassWithInitArgs(EchoWorker)) as wg:
        assert wg.one_to_all(3) == [(0, 3, None)]
    assert wg.closed


def test_the_last_group_using_a_pool_releases_it() -> None:
    pool = CountingPool([1])
    first = LocalWorkerGroup(pool, ClassWithInitArgs(EchoWorker))
    second = LocalWorkerGroup(pool, ClassWithInitArgs(EchoWorker))
    first.close()
    assert pool.released == 0
    second.close()
    second.close()
    assert pool.released == 1


def test_spawned_groups_share_the_lifecycle_and_release_the_pool_once() -> None:
    pool = CountingPool([2])
    cls = create_colocated_worker_cls({"a": ClassWithInitArgs(EchoWorker)})
    wg = LocalWorkerGroup(pool, ClassWithInitArgs(cls))
    role = wg.spawn(["a"])["a"]
    assert role.one_to_all(1) == [(0, 1, None), (1, 1, None)]
    role.close()  # closing any group of the set closes the workers they share
    assert wg.closed
    assert pool.released == 1
    with pytest.raises(WorkerGroupClosedError):
        wg.a_one_to_all(1)
    wg.close()
    assert pool.released == 1


def test_a_constructor_failure_leaves_no_rank_threads() -> None:
    class Broken(EchoWorker):
        def __init__(self) -> None:
            raise RuntimeError("no")

    with pytest.raises(WorkerError, match="no") as info:
        LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(Broken), name_prefix="lcbroken")
    for thread in _rank_threads("lcbroken"):
        thread.join(timeout=10)
    assert _rank_threads("lcbroken") == []
    assert isinstance(info.value.__cause__, RuntimeError)
