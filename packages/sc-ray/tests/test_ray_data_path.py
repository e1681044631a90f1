"""DataProto through Ray: each shard put once, futures chained between groups without the
driver fetching data, padding removed from futures, failures surfacing from futures;
streamed calls and the load-balanced mode on Ray. Local cluster: 8 CPUs."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from sc_core import SpanRecorder, Worker, WorkerError
from sc_dispatch import (
    Dispatch,
    Execute,
    make_balanced_dispatch_fn,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from sc_protocol import DataProto, DataProtoFuture
from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tensordict import TensorDict

RAY_INIT: dict[str, Any] = {"num_cpus": 8}

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("no_leaks")]


def _col(data: DataProto, key: str) -> torch.Tensor:
    if data.batch is None:
        raise AssertionError("the DataProto has no tensor batch")
    value: torch.Tensor = data.batch[key]
    return value


def _batch(rows: int, width: int = 4, padding: bool = False) -> DataProto:
    x = torch.arange(rows * width, dtype=torch.float32).reshape(rows, width)
    return DataProto.from_dict({"x": x}, auto_padding=padding)


class Producer(Worker):
    def __init__(self) -> None:
        super().__init__()
        # Two dp groups of two ranks each on the mesh "dp" (ranks 0, 2 collect).
        self._register_dispatch_collect_info("dp", self.rank // 2, self.rank % 2 == 0)
        # Pipeline stages (pp slowest), the first and last stage reading the batch: 2 stages
        # x 2 dp on "pp2" (every rank is a first or last stage), 4 stages x 1 dp on "pp4"
        # (ranks 1 and 2 are middle stages: metadata only).
        self._register_dispatch_collect_info("pp2", self.rank % 2, self.rank // 2 == 1)
        self._register_dispatch_collect_info(
            "pp4", 0, self.rank == 3, receives_data=self.rank in (0, 3)
        )
        self._stage_seen: dict[str, tuple[int, list[str], dict[str, Any], float]] = {}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double(self, data: DataProto) -> DataProto:
        out = DataProto.from_dict({"y": _col(data, "x") * 2})
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double_now(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": _col(data, "x") * 2})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_BALANCED)
    def double_balanced(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": _col(data, "x") * 2})

    @register(dispatch_mode=make_balanced_dispatch_fn(3, mesh_name="dp"))
    def nd_double_balanced(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(
            {"y": _col(data, "x") * 2, "r": torch.full((len(data),), self.rank)}
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def broken(self, data: DataProto) -> DataProto:
        raise KeyError(f"no column on rank {self.rank}")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rows(self, data: DataProto) -> int:
        return len(data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("dp"))
    def nd_rows(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"r": torch.full((len(data),), self.rank)})

    def _stage(self, mesh: str, data: DataProto) -> DataProto:
        columns = [] if data.batch is None else list(data.batch.keys())  # iter() is rows
        keys = sorted(str(k) for k in columns)
        first = float(_col(data, "x")[0, 0]) if keys else -1.0
        self._stage_seen[mesh] = (len(data), keys, dict(data.meta_info), first)
        return DataProto.from_dict({"r": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("pp2"))
    def stage_pp2(self, data: DataProto) -> DataProto:
        return self._stage("pp2", data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("pp4"))
    def stage_pp4(self, data: DataProto) -> DataProto:
        return self._stage("pp4", data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stage_seen(self, mesh: str) -> tuple[int, list[str], dict[str, Any], float]:
        return self._stage_seen[mesh]

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("dp"), blocking=False)
    def nd_rows_later(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"r": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("dp"), blocking=False)
    def nd_td_later(self, data: TensorDict) -> TensorDict:
        return TensorDict(
            {"y": data["x"] * 2, "r": torch.full((len(data),), self.rank)},
            batch_size=[len(data)],
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def td_double_later(self, data: TensorDict) -> TensorDict:
        return TensorDict({"y": data["x"] * 2}, batch_size=[len(data)])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add_in_place(self, data: DataProto | TensorDict) -> list[float]:
        # verl's workers may write into the batch they receive; no peer may see it.
        x = _col(data, "x") if isinstance(data, DataProto) else data["x"]
        time.sleep(0.2)  # every rank has its batch before any writes
        x += 10**self.rank
        time.sleep(0.2)
        return [float(v) for v in x[:, 0].tolist()]

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("dp"))
    def nd_add_in_place(self, data: DataProto) -> DataProto:
        x = _col(data, "x")
        time.sleep(0.2)
        x += 10**self.rank
        time.sleep(0.2)
        return DataProto.from_dict({"seen": x[:, 0].clone()})


class Consumer(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, materialize_futures=False)
    def inspect(self, data: Any) -> list[list[int]]:
        # Receives the future itself: how many producer shards it refers to, and its rows.
        shards = len(data.shard_refs) if isinstance(data, DataProtoFuture) else -1
        value = data.get()
        return [[shards, len(value), int(_col(value, "y")[0, 0].item())]]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def bump_in_place(self, data: DataProto) -> list[int]:
        _col(data, "y").add_(1)
        return [len(data)]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def total(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"s": _col(data, "y").sum(dim=1)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def mapping_of(self, data: DataProto) -> list[str]:
        # Which memory mapping of this process holds the received tensor's bytes.
        address = _col(data, "x").data_ptr()
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                start, end = (int(a, 16) for a in fields[0].split("-"))
                if start <= address < end:
                    return [fields[5].strip() if len(fields) == 6 else "[anonymous]"]
        return ["[not mapped]"]


@pytest.fixture(scope="module")
def groups(ray_cluster: None) -> Iterator[tuple[RayWorkerGroup, RayWorkerGroup]]:
    """A producer of 4 ranks (two dp groups of two on mesh "dp") and a consumer of 2, shared
    by the module: workers importing torch are slow to start on a small machine."""
    producer = RayWorkerGroup(RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(Producer))
    try:
        consumer = RayWorkerGroup(
            RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(Consumer)
        )
    except BaseException:
        producer.shutdown()
        raise
    with producer, consumer:
        yield producer, consumer


def test_shards_are_put_once_and_results_joined(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    wg, _ = groups
    data = _batch(12)
    with SpanRecorder() as rec:
        out = wg.double_now(data)
        assert torch.equal(_col(out, "y"), _col(data, "x") * 2)
        assert wg.rows(data) == [12, 12, 12, 12]
        nd = wg.nd_rows(data)  # ranks 0 and 2 collect: rows 0-5 from rank 0, 6-11 from 2
        assert _col(nd, "r").tolist() == [0] * 6 + [2] * 6
    spans = {s.method: s for s in rec.spans}
    nbytes = 12 * 4 * 4
    # Four small shards, one per rank, travel inline in their tasks (no put); ONE_TO_ALL and
    # nd put each object that several ranks receive once.
    assert spans["double_now"].bytes_put == 0
    assert spans["double_now"].bytes_fetched == nbytes
    assert spans["rows"].bytes_put == nbytes
    assert spans["nd_rows"].bytes_put == nbytes
    assert {p.rank for p in spans["double_now"].phases if p.rank is not None} == {0, 1, 2, 3}


def test_large_shards_are_put_once_each(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    wg, _ = groups
    data = _batch(4 * 8192, width=4)  # four shards of 128 KiB: above Ray's inline limit
    with SpanRecorder() as rec:
        out = wg.double_now(data)
    assert torch.equal(_col(out, "y"), _col(data, "x") * 2)
    (span,) = rec.spans
    assert span.bytes_put == 4 * 8192 * 4 * 4


def test_middle_pipeline_stages_receive_the_shards_metadata_only(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    wg, _ = groups
    data = _batch(8)
    data.meta_info["step"] = 3
    nbytes = 8 * 4 * 4
    assert wg.query_mesh("pp2").receives_data == (True, True, True, True)
    assert wg.query_mesh("pp4").receives_data == (True, False, False, True)
    with SpanRecorder() as rec:
        out2 = wg.stage_pp2(data)
        out4 = wg.stage_pp4(data)
    # pp2: dp 0 is ranks 0 (stage 0) and 2 (stage 1, collects), dp 1 ranks 1 and 3
    assert _col(out2, "r").tolist() == [2] * 4 + [3] * 4
    step = {"step": 3}
    assert wg.stage_seen("pp2") == [
        (4, ["x"], step, 0.0),
        (4, ["x"], step, 16.0),
        (4, ["x"], step, 0.0),
        (4, ["x"], step, 16.0),
    ]
    # pp4: the last stage collects; the middle stages get the row count and meta_info only
    assert _col(out4, "r").tolist() == [3] * 8
    assert wg.stage_seen("pp4") == [
        (8, ["x"], step, 0.0),
        (8, [], step, -1.0),
        (8, [], step, -1.0),
        (8, ["x"], step, 0.0),
    ]
    spans = {s.method: s for s in rec.spans}
    # each shard is put once for the ranks that read it; the metadata object weighs nothing
    assert spans["stage_pp2"].bytes_put == nbytes
    assert spans["stage_pp4"].bytes_put == nbytes
    plan = wg.stage_pp4.spec.plan(wg, Execute.ALL, (data,), {})
    assert plan.rank_nbytes() == {0: nbytes, 1: 0, 2: 0, 3: nbytes}


def test_nd_future_holds_collect_ranks_only(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    wg, _ = groups
    future = wg.nd_rows_later(_batch(8))
    assert isinstance(future, DataProtoFuture)
    assert len(future.shard_refs) == 2  # ranks 0 and 2 of 4
    assert future.row_counts == (4, 4)
    assert _col(future.get(), "r").tolist() == [0] * 4 + [2] * 4


def test_futures_of_tensordict_calls_resolve_to_the_joined_tensordict(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    # verl's future resolves to whatever the workers returned, TensorDicts included.
    wg, _ = groups
    x = torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4)
    nd: DataProtoFuture[TensorDict] = wg.nd_td_later(TensorDict({"x": x}, batch_size=[8]))
    assert len(nd.shard_refs) == 2
    value = nd.get()
    assert isinstance(value, TensorDict)
    assert torch.equal(value["y"], x * 2)
    assert value["r"].tolist() == [0] * 4 + [2] * 4
    even: DataProtoFuture[TensorDict] = wg.td_double_later(TensorDict({"x": x}, batch_size=[8]))
    assert torch.equal(even.get()["y"], x * 2)
    halves = [part.get()["y"] for part in even.chunk(2)]
    assert torch.equal(halves[0], x[:4] * 2)
    assert torch.equal(halves[1], x[4:] * 2)


def test_future_chain_never_passes_through_the_driver(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    producer, consumer = groups
    data = _batch(12)
    with SpanRecorder() as rec:
        future = producer.double(data)
        assert isinstance(future, DataProtoFuture)
        # 4 producer shards of 3 rows, 2 consumer shards of 6: each consumer rank refers to
        # the 2 producer shards overlapping its rows, not to all 4.
        seen = consumer.inspect(future)
        assert [s[0] for s in seen] == [2, 2]
        assert [s[1] for s in seen] == [6, 6]
        assert [s[2] for s in seen] == [0, 48]
        summed = consumer.total(producer.double(data))
        assert torch.equal(_col(summed, "s"), (_col(data, "x") * 2).sum(dim=1))
    chained = [s for s in rec.spans if s.method in ("double", "inspect")]
    assert len(chained) == 3
    assert all(s.bytes_fetched == 0 for s in chained)
    assert torch.equal(_col(future.get(), "y"), _col(data, "x") * 2)


def test_uneven_chain_slices_inside_the_consumer(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    producer, consumer = groups
    data = _batch(10, padding=True)  # producer shards 3, 3, 3, 1 + 2 padding; consumer 5, 5
    seen = consumer.inspect(producer.double(data))
    assert [s[1] for s in seen] == [5, 5]
    assert [s[2] for s in seen] == [0, 40]
    assert [s[0] for s in seen] == [2, 3]


def test_padded_future_has_no_padding_rows(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    wg, _ = groups
    data = _batch(5, padding=True)
    value = wg.double(data).get()
    assert len(value) == 5
    assert torch.equal(_col(value, "y"), _col(data, "x") * 2)


def test_future_of_a_failed_call_raises_worker_error(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    wg, _ = groups
    future = wg.broken(_batch(4))
    with pytest.raises(WorkerError) as info:
        future.get()
    assert info.value.method == "broken"
    assert info.value.error_type == "KeyError"


def test_a_stream_yields_every_row_once_as_shards_finish(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    wg, _ = groups
    data = _batch(10, padding=True)  # shards 3, 3, 3, 1 + 2 padding rows
    with SpanRecorder() as rec:
        stream = wg.double_now.stream(data)
        items = list(stream)
    assert sorted(r for rows, _ in items for r in rows) == list(range(10))
    for rows, shard in items:
        assert torch.equal(_col(shard, "y"), _col(data, "x")[list(rows)] * 2)
    assert torch.equal(_col(stream.result(), "y"), _col(data, "x") * 2)
    (span,) = rec.spans
    assert span.error is None
    assert {p.rank for p in span.phases if p.rank is not None} == {0, 1, 2, 3}
    with pytest.raises(WorkerError) as info:
        list(wg.broken.stream(_batch(4)))
    assert info.value.error_type == "KeyError"


def test_balanced_modes_return_the_even_result_on_ray(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    wg, _ = groups
    data = _batch(13, padding=True)
    even = _col(wg.double_now(data), "y")
    assert torch.equal(_col(wg.double_balanced(data), "y"), even)
    nd = wg.nd_double_balanced(data)
    assert torch.equal(_col(nd, "y"), even)
    assert set(_col(nd, "r").tolist()) <= {0, 2}  # the collect ranks of the two dp groups
    ordered = list(wg.nd_double_balanced.options(in_order=True).stream(data))
    # 13 rows in micro-shards of at most 3: five of 3, 3, 3, 2, 2 rows, in input order
    expected = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10], [11, 12]]
    assert [list(rows) for rows, _ in ordered] == expected


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
@pytest.mark.parametrize("kind", ["DataProto", "TensorDict"])
def test_a_batch_several_ranks_receive_is_private_to_each(
    groups: tuple[RayWorkerGroup, RayWorkerGroup], kind: str
) -> None:
    # Large enough to live in the shared-memory store, where the ranks of a node would read
    # the same bytes: each rank's in-place write must stay its own (verl's semantics).
    wg, _ = groups
    x = torch.zeros(64 * 1024, 8)
    data: DataProto | TensorDict = (
        DataProto.from_dict({"x": x}) if kind == "DataProto" else TensorDict({"x": x}, [len(x)])
    )
    seen = wg.add_in_place(data)
    assert [s[0] for s in seen] == [1.0, 10.0, 100.0, 1000.0]
    assert float(x.sum()) == 0.0  # the driver's batch is untouched


def test_the_ranks_of_a_dp_group_get_private_copies_of_their_shard(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    wg, _ = groups
    out = wg.nd_add_in_place(DataProto.from_dict({"x": torch.zeros(2 * 32 * 1024, 8)}))
    seen = _col(out, "seen")  # the collect ranks 0 and 2: their own addition only
    assert set(seen[: 32 * 1024].tolist()) == {1.0}
    assert set(seen[32 * 1024 :].tolist()) == {100.0}


def test_readers_of_one_future_get_private_copies(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    # Whoever resolves a future (a consumer rank, the driver) may write into what it got;
    # the stored output, which other readers fetch, must not change.
    producer, consumer = groups
    data = _batch(4 * 8 * 1024, width=8)  # 4 shards of 256 KiB: in the shared-memory store
    future = producer.double(data)
    consumer.bump_in_place(future)
    assert torch.equal(_col(future.get(), "y"), _col(data, "x") * 2)
    rows = 8 * 1024
    first = DataProtoFuture.from_shards(future.shard_refs[:1], [rows])  # one shard: no concat
    _col(first.get(), "y").add_(1)
    again = DataProtoFuture.from_shards(future.shard_refs[:1], [rows]).get()
    assert torch.equal(_col(again, "y"), _col(data, "x")[:rows] * 2)


def test_worker_reads_tensors_in_place_from_the_object_store(
    groups: tuple[RayWorkerGroup, RayWorkerGroup],
) -> None:
    # Shards large enough for Ray's shared-memory object store (small objects are inlined).
    _, consumer = groups
    data = DataProto.from_dict({"x": torch.ones(2 * 64 * 1024, 8)})
    mappings = consumer.mapping_of(data)
    assert len(mappings) == 2
    # The tensor aliases the store's shared file mapping: no copy into private memory.
    for name in mappings:
        assert name.startswith("/dev/shm") or "plasma" in name, mappings
