"""What a verl program relies on, through RayWorkerGroup: plain Ray references from
non-blocking calls, DataProtoFutures over them, remote exceptions caught by their own
class, strict splitting, mesh errors on the driver, nested pool splits, fail-fast pools,
no deadlock for futures given to asyncio workers, ``parallel_put``. Local cluster: 8 CPUs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch
from sc_core import ConfigTypeError, InvalidConfigError, Worker, WorkerError
from sc_dispatch import (
    Dispatch,
    MeshLayoutError,
    NotShardableError,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from sc_protocol import DataProto, DataProtoFuture
from sc_ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    parallel_put,
    split_resource_pool,
)
from sc_ray import _ray_api as rapi

RAY_INIT: dict[str, Any] = {"num_cpus": 8}

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("no_leaks")]


def _batch(rows: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(rows, dtype=torch.float32)})


def _x(data: DataProto) -> list[float]:
    if data.batch is None:
        raise AssertionError("no tensor batch")
    values: list[float] = data.batch["x"].tolist()
    return values


class Failure(Exception):
    """A user's exception class, with an attribute of its own."""

    def __init__(self, code: int) -> None:
        super().__init__(f"failure {code}")
        self.code = code


class Verl(Worker):
    def __init__(self) -> None:
        super().__init__()
        self._register_dispatch_collect_info("dp", self._rank // 2, self._rank % 2 == 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def later(self, value: int) -> int:
        return value + self._rank

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, blocking=False)
    def each(self, value: int) -> int:
        return value * 10

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def shard_later(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": torch.tensor(_x(data)) + 100})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def shard_now(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def take(self, data: DataProto) -> list[float]:
        return _x(data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, materialize_futures=False)
    def take_raw(self, data: Any) -> str:
        return type(data).__name__

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail(self, kind: str) -> None:
        if kind == "value":
            raise ValueError(f"bad value on rank {self._rank}")
        raise Failure(self._rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def fail_later(self) -> None:
        raise KeyError(f"missing on rank {self._rank}")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("nowhere"))
    def on_unknown_mesh(self, data: DataProto) -> DataProto:  # pragma: no cover - not sent
        return data

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("dp"), blocking=False)
    def nd_later(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.DIRECT_ROLLOUT_METHOD)
    def rollout_only(self) -> None:  # pragma: no cover - never reached from the driver
        return None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env(self, key: str) -> str | None:  # a name users write: must not break Worker
        import os

        return os.environ.get(key)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def config(self, key: str) -> str:
        return f"config {key}"


@pytest.fixture(scope="module")
def wg(ray_cluster: None) -> Iterator[RayWorkerGroup]:
    with RayWorkerGroup(
        RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(Verl), bin_pack=False
    ) as group:
        yield group


@pytest.fixture(autouse=True)
def no_leaks() -> None:
    """The module-scoped group outlives each test; leaks are checked by the other modules."""


def test_non_blocking_one_to_all_and_all_to_all_return_ray_references(wg: RayWorkerGroup) -> None:
    refs = wg.later(5)
    assert isinstance(refs, list)
    assert all(isinstance(r, ray.ObjectRef) for r in refs)
    assert ray.get(refs) == [5, 6, 7, 8]
    per_rank = wg.each([1, 2, 3, 4])
    assert ray.get(per_rank) == [10, 20, 30, 40]
    assert ray.get(wg.execute_all("later", 1)) == [1, 2, 3, 4]  # verl: execute_all is async
    assert ray.get(wg.execute_rank_zero("later", 1)) == 1
    assert wg.execute_all_sync("later", 1) == [1, 2, 3, 4]
    assert wg.execute_rank_zero_sync("later", 1) == 1


def test_data_proto_future_over_plain_references_needs_no_resolver(wg: RayWorkerGroup) -> None:
    refs = [ray.put(_batch(2)), ray.put(DataProto.from_dict({"x": torch.tensor([2.0, 3.0])}))]
    future = DataProtoFuture(collect_fn=DataProto.concat, futures=refs)
    assert _x(future.get()) == [0.0, 1.0, 2.0, 3.0]
    joined = DataProtoFuture.concat(refs)
    assert [_x(part.get()) for part in joined.chunk(2)] == [[0.0, 1.0], [2.0, 3.0]]
    # @register materializes such a future in every worker; materialize_futures=False keeps it.
    assert wg.take(joined) == [[0.0, 1.0, 2.0, 3.0]] * 4
    assert wg.take_raw(joined) == ["DataProtoFuture"] * 4


def test_non_blocking_splitting_and_nd_calls_return_data_proto_futures(wg: RayWorkerGroup) -> None:
    future = wg.shard_later(_batch(8))
    assert isinstance(future, DataProtoFuture)
    assert _x(future.get()) == [float(100 + i) for i in range(8)]
    nd = wg.nd_later(_batch(4))
    assert isinstance(nd, DataProtoFuture)
    assert _x(nd.get()) == [0.0, 1.0, 2.0, 3.0]
    # Collecting plain references with a splitting mode's collect function (verl's
    # collect_fn receives references) gives a DataProtoFuture too.
    from sc_dispatch.verl import collect_dp_compute_data_proto

    refs = [ray.put(_batch(1)), ray.put(_batch(1))]
    assert isinstance(collect_dp_compute_data_proto(wg, refs), DataProtoFuture)
    nd_collect = make_nd_compute_dataproto_dispatch_fn("dp")["collect_fn"]
    four = [ray.put(_batch(1)) for _ in range(4)]
    joined = nd_collect(wg, four)  # collect ranks 0 and 2, in dp order
    assert isinstance(joined, DataProtoFuture)
    assert len(joined.get()) == 2


@pytest.mark.parametrize(("kind", "builtin"), [("value", ValueError), ("custom", Failure)])
def test_remote_exception_is_a_worker_error_and_its_own_class(
    wg: RayWorkerGroup, kind: str, builtin: type
) -> None:
    with pytest.raises(builtin) as info:
        wg.fail(kind)
    err = info.value
    assert isinstance(err, WorkerError)
    assert (err.method, err.rank, err.other_failed_ranks) == ("fail", 0, (1, 2, 3))
    assert "Remote traceback (rank 0)" in str(err)
    assert "in fail" in err.remote_traceback
    assert "_sc_call" not in err.remote_traceback.splitlines()[1]  # the wrapper is trimmed
    if kind == "custom":
        assert err.cause.code == 0  # type: ignore[union-attr]


def test_ray_get_on_a_non_blocking_calls_references_raises_the_same(wg: RayWorkerGroup) -> None:
    refs = wg.fail_later()
    with pytest.raises(KeyError) as info:
        ray.get(refs[2])
    assert isinstance(info.value, WorkerError)
    assert info.value.rank == 2
    assert info.value.method == "fail_later"


def test_strict_typing_and_splitting_before_anything_is_sent(wg: RayWorkerGroup) -> None:
    with pytest.raises(TypeError, match=r"shard_now: DP_COMPUTE_PROTO: .* is a list") as info:
        wg.shard_now([1, 2, 3, 4])
    assert isinstance(info.value, NotShardableError)
    with pytest.raises(TypeError, match=r"of type dict cannot be split"):
        wg.shard_now({"x": [1, 2, 3, 4]})
    with pytest.raises(ValueError, match=r"a batch of 6 rows does not divide evenly into 4"):
        wg.shard_now(_batch(6))
    with pytest.raises(NotImplementedError, match="DIRECT_ROLLOUT_METHOD"):
        wg.rollout_only()


def test_unregistered_mesh_is_one_error_on_the_driver(wg: RayWorkerGroup) -> None:
    with pytest.raises(MeshLayoutError, match=r"no rank registered the mesh 'nowhere'") as info:
        wg.on_unknown_mesh(_batch(4))
    assert isinstance(info.value, ValueError)
    assert not isinstance(info.value, WorkerError)


def test_user_method_names_do_not_break_the_worker(wg: RayWorkerGroup) -> None:
    assert wg.env("RANK") == ["0", "1", "2", "3"]
    assert wg.config("lr") == ["config lr"] * 4


class Rank(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rank_of(self) -> int:
        return self._rank


@pytest.mark.extended
def test_splitting_a_split_pool_keeps_bundle_indices_relative_to_the_root(
    ray_cluster: None,
) -> None:
    # One actor fills a bundle (max_colocate_count=1), so groups on all three sub-pools can
    # only start together if each sits on its own bundle of the root: 0, 1 and 2.
    root = RayResourcePool([3], use_gpu=False, name_prefix="nested_", max_colocate_count=1)
    try:
        first, second = split_resource_pool(root, [1, 2])
        left, right = split_resource_pool(second, [1, 1])
        assert [p.start_bundle_index for p in (first, second, left, right)] == [0, 1, 1, 2]
        assert left.parent is root
        assert right.parent is root
        assert [s.bundle_index for s in left.bundle_slots()] == [1]
        assert [s.bundle_index for s in right.bundle_slots()] == [2]
        groups = [
            RayWorkerGroup(pool, RayClassWithInitArgs(Rank), start_timeout=30)
            for pool in (first, left, right)
        ]
        try:
            assert [g.rank_of() for g in groups] == [[0], [0], [0]]
        finally:
            for group in groups:
                group.shutdown()
    finally:
        root.release()


class AsyncPair(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    async def produce(self, data: DataProto) -> DataProto:
        await asyncio.sleep(0.3)  # still running when the consumer's call arrives
        return DataProto.from_dict({"x": torch.tensor(_x(data)) * 2})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    async def consume(self, data: DataProto) -> DataProto:
        return data


def test_future_to_async_workers_from_their_own_async_method_does_not_deadlock(
    ray_cluster: None,
) -> None:
    with RayWorkerGroup(
        RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(AsyncPair)
    ) as pair:
        start = time.monotonic()
        future = pair.produce(_batch(4))
        out = pair.method(AsyncPair.consume).options(timeout=60)(future)
        assert _x(out) == [0.0, 2.0, 4.0, 6.0]
        assert time.monotonic() - start < 60


# --- parallel_put (verl's tests/single_controller/test_ray_utils_on_cpu.py) ------------------


def test_parallel_put_returns_references_in_order(ray_cluster: None) -> None:
    data: list[Any] = [1, "hello", {"a": 2}, [3, 4], torch.arange(3)]
    refs = parallel_put(data)
    assert len(refs) == len(data)
    assert all(rapi.is_object_ref(ref) for ref in refs)
    got = rapi.get(refs, timeout_s=30)
    assert got[:4] == data[:4]
    assert torch.equal(got[4], data[4])
    many = list(range(40))
    assert rapi.get(parallel_put(many, max_workers=4), timeout_s=30) == many
    assert rapi.get(parallel_put(tuple(many), max_workers=1), timeout_s=30) == many
    assert rapi.get(parallel_put(many), timeout_s=30) == many  # at most 16 threads


def test_parallel_put_errors(ray_cluster: None) -> None:
    with pytest.raises(ValueError, match=r"parallel_put: data_list is empty \(\[\]\)") as info:
        parallel_put([])
    assert isinstance(info.value, InvalidConfigError)
    for bad in ("abc", iter([1]), {"a": 1}, None):
        with pytest.raises(TypeError, match="parallel_put: data_list must be a list") as t_info:
            parallel_put(bad)  # type: ignore[arg-type]
        assert isinstance(t_info.value, ConfigTypeError)
    with pytest.raises(InvalidConfigError, match="max_workers must be at least 1, got 0"):
        parallel_put([1], max_workers=0)
    for wrong in (True, 2.0, "2"):
        with pytest.raises(ConfigTypeError, match="max_workers must be an int or None"):
            parallel_put([1], max_workers=wrong)  # type: ignore[arg-type]
