"""Edges found by probing (issue 12) on Ray: TensorDict shards that carried their parent's
whole storage, deadlines that non-blocking calls ignored, ranks left running an abandoned
call, a detached pool an attached driver could not release, a reserved variable.
Local cluster: 8 CPUs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch
from sc_core import CallTimeoutError, SpanRecorder, Worker
from sc_dispatch import Dispatch, register
from sc_protocol import DataProto, DataProtoFuture
from sc_ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerEnvError,
)
from sc_ray import _ray_api as rapi
from sc_ray._actor_launch import check_worker_env
from tensordict import TensorDict

RAY_INIT: dict[str, Any] = {"num_cpus": 8, "namespace": "sc_ray_edges"}

# The slow methods sleep 20 s: a deadline that is ignored shows as a value returned instead
# of CallTimeoutError, within the test timeout.
pytestmark = [pytest.mark.timeout(150), pytest.mark.usefixtures("no_leaks")]

ROWS, WIDTH = 10_000, 1_000  # 40 MB of float32


class Probe(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def storage_bytes(self, td: TensorDict) -> tuple[int, int]:
        x: torch.Tensor = td["x"]
        return x.shape[0], x.untyped_storage().nbytes()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def slice_of_big(self, rows: int) -> TensorDict:
        big = TensorDict({"x": torch.ones(ROWS, WIDTH)}, batch_size=[ROWS])
        view: TensorDict = big[:rows]
        return view

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self._rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def slow_rows(self, data: DataProto) -> DataProto:
        time.sleep(float(data.meta_info["seconds"]))
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def take(self, data: DataProto) -> DataProto:
        return data


class AsyncProbe(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def sleep(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return self._rank


@pytest.fixture(scope="module")
def wg(ray_cluster: None) -> Iterator[RayWorkerGroup]:
    with RayWorkerGroup(
        RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(Probe), bin_pack=False
    ) as group:
        yield group


@pytest.fixture(autouse=True)
def no_leaks() -> None:
    """The module-scoped group outlives each test; the other modules check for leaks."""


def _batch(rows: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(rows, dtype=torch.float32)})


def test_tensordict_shards_carry_only_their_rows(wg: RayWorkerGroup) -> None:
    td = TensorDict({"x": torch.ones(ROWS, WIDTH)}, batch_size=[ROWS])
    with SpanRecorder() as recorder:
        received = wg.storage_bytes(td)
    shard_bytes = (ROWS // 4) * WIDTH * 4
    assert received == [(ROWS // 4, shard_bytes)] * 4  # 10 MB each, not the 40 MB storage
    (span,) = [s for s in recorder.spans if s.method == "storage_bytes"]
    assert span.bytes_put == 4 * shard_bytes  # what traveled, as the span reports it


def test_a_returned_view_carries_only_its_rows(wg: RayWorkerGroup) -> None:
    views = wg.slice_of_big(10)
    assert [v.batch_size[0] for v in views] == [10] * 4
    assert all(v["x"].untyped_storage().nbytes() == 10 * WIDTH * 4 for v in views)


def test_a_non_blocking_splitting_call_keeps_its_deadline(wg: RayWorkerGroup) -> None:
    quick = wg.sleep.options(timeout=30, blocking=False)(0.0)
    assert ray.get(quick) == [0, 1, 2, 3]  # within the deadline, the values come through
    batch = _batch(4)
    batch.meta_info["seconds"] = 20.0
    future = wg.slow_rows.options(timeout=0.5, blocking=False)(batch)
    assert isinstance(future, DataProtoFuture)
    with pytest.raises(CallTimeoutError, match=r"slow_rows: no answer from rank.* 0.5s"):
        future.get()
    # Given to another call, the same future fails at the same deadline (here already while
    # the driver splits it: its shards' row counts are late as well).
    with pytest.raises(CallTimeoutError, match=r"slow_rows: no answer from rank"):
        wg.take(future)


def test_ray_get_of_a_non_blocking_calls_references_keeps_its_deadline(
    wg: RayWorkerGroup,
) -> None:
    refs = wg.sleep.options(timeout=0.5, blocking=False)(20.0)
    assert all(rapi.is_object_ref(r) for r in refs)
    with pytest.raises(CallTimeoutError) as info:
        ray.get(refs[1])
    assert info.value.method == "sleep"
    assert info.value.pending_ranks == (1,)


def test_ranks_still_running_an_abandoned_call_are_named(ray_cluster: None) -> None:
    with RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(Probe)) as group:
        with pytest.raises(CallTimeoutError) as info:
            group.sleep.options(timeout=0.5)(3.0)
        assert "are still running an abandoned call" in str(info.value)
        assert "rank 0 (sleep" in str(info.value)
        assert set(group.busy_ranks) == {0, 1}
        assert group.sleep(0.0) == [0, 1]  # starts when the abandoned call finishes
        assert group.busy_ranks == {}


def test_an_abandoned_call_of_an_asyncio_worker_is_cancelled(ray_cluster: None) -> None:
    with RayWorkerGroup(
        RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(AsyncProbe)
    ) as group:
        with pytest.raises(CallTimeoutError):
            group.sleep.options(timeout=0.5)(50.0)
        deadline = time.monotonic() + 20
        while group.busy_ranks:  # cancelled, not left to sleep for 50 s
            assert time.monotonic() < deadline, group.busy_ranks
            time.sleep(0.1)
        assert group.sleep(0.0) == [0, 1]


def _pool_resources(pool: RayResourcePool) -> set[str]:
    """The cluster resources that exist only while the pool's placement groups do."""
    ids = {rapi.placement_group_id(pg) for pg in pool.pgs or []}
    return {k for k in rapi.cluster_resources() if any(k.endswith(i) for i in ids)}


def test_an_attached_group_releases_the_detached_pool(ray_cluster: None) -> None:
    pool = RayResourcePool([2], use_gpu=False, name_prefix="released_", detached=True)
    original = RayWorkerGroup(
        pool, RayClassWithInitArgs(Probe), name_prefix="detpool", detached=True
    )
    pgs = list(pool.pgs or [])
    held = _pool_resources(pool)
    assert held  # e.g. CPU_group_<id>: reserved while the placement group exists
    # Another driver attaches by name and closes the group.
    attached = RayWorkerGroup.from_detached(
        worker_names=original.worker_names, ray_cls_with_init=RayClassWithInitArgs(Probe)
    )
    assert attached.sleep(0.0) == [0, 1]
    attached.shutdown()
    deadline = time.monotonic() + 20
    while held & set(rapi.cluster_resources()):
        assert time.monotonic() < deadline, sorted(held & set(rapi.cluster_resources()))
        time.sleep(0.2)
    assert all(rapi.placement_group_state(pg) == "REMOVED" for pg in pgs)
    # The pool's name is free again.
    again = RayResourcePool([2], use_gpu=False, name_prefix="released_", detached=True)
    try:
        assert len(again.get_placement_groups()) == 1
    finally:
        again.release()
    original.shutdown()


def test_sc_rendezvous_is_reserved(ray_cluster: None) -> None:
    with pytest.raises(WorkerEnvError, match="SC_RENDEZVOUS"):
        check_worker_env({"SC_RENDEZVOUS": "evil.module:factory"})
