"""Planned calls with real DataProtos (in-process groups): the load-balanced mode returns
exactly the even split's batch (tensors and non-tensor columns) for any batch size, world
size and micro-shard size, padded batches included; a stream yields every row once; sticky
routing reads its key from a non-tensor column."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_core import ClassWithInitArgs, LocalWorkerGroup, ResourcePool, Worker
from sc_dispatch import Dispatch, make_balanced_dispatch_fn, make_sticky_dispatch_fn, register
from sc_protocol import DataProto


def _rows(data: DataProto, rank: int) -> DataProto:
    assert data.batch is not None
    x = data.batch["x"]
    return DataProto.from_dict(
        tensors={"y": x * 2 + 1, "sum": x.sum(dim=-1)},
        non_tensors={
            "tag": np.array([f"{t}!" for t in data.non_tensor_batch["tag"]], dtype=object)
        },
        meta_info={"m": 1},
    )


class ProtoWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def even(self, data: DataProto) -> DataProto:
        return _rows(data, self.rank)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_BALANCED)
    def balanced(self, data: DataProto) -> DataProto:
        return _rows(data, self.rank)

    @register(dispatch_mode=make_balanced_dispatch_fn(3))
    def balanced_3(self, data: DataProto) -> DataProto:
        return _rows(data, self.rank)

    @register(dispatch_mode=make_sticky_dispatch_fn("tag"))
    def sticky(self, data: DataProto) -> DataProto:
        out = _rows(data, self.rank)
        out.non_tensor_batch["rank"] = np.full(len(data), self.rank)
        return out


@pytest.fixture(scope="module")
def groups() -> Iterator[dict[int, LocalWorkerGroup]]:
    made = {
        n: LocalWorkerGroup(ResourcePool([n]), ClassWithInitArgs(ProtoWorker)) for n in (1, 2, 3)
    }
    yield made
    for g in made.values():
        g.close()


def _batch(rows: int, padding: bool = True) -> DataProto:
    x = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    tags = np.array([f"r{i}" for i in range(rows)], dtype=object)
    return DataProto.from_dict(tensors={"x": x}, non_tensors={"tag": tags}, auto_padding=padding)


def _same(a: DataProto, b: DataProto) -> None:
    assert a.batch is not None
    assert b.batch is not None
    assert set(a.batch.keys()) == set(b.batch.keys())
    for key in a.batch.keys():  # noqa: SIM118 - iterating a TensorDict yields its rows
        assert torch.equal(a.batch[key], b.batch[key]), key
    assert list(a.non_tensor_batch["tag"]) == list(b.non_tensor_batch["tag"])


@settings(deadline=None, max_examples=25)
@given(
    rows=st.integers(1, 40),
    world=st.sampled_from([1, 2, 3]),
    method=st.sampled_from(["balanced", "balanced_3"]),
)
def test_balanced_dataproto_equals_the_even_split(
    groups: dict[int, LocalWorkerGroup], rows: int, world: int, method: str
) -> None:
    g = groups[world]
    even = g.even(_batch(rows))  # the even split needs auto-padding when rows % world != 0
    batch = _batch(rows, padding=False)  # the balanced mode needs none (7 rows on 3 ranks)
    _same(getattr(g, method)(batch), even)
    items = list(getattr(g, method).stream(batch))
    assert sorted(r for rs, _ in items for r in rs) == list(range(rows))
    for rs, shard in items:
        assert list(shard.non_tensor_batch["tag"]) == [f"r{i}!" for i in rs]


def test_a_padded_even_stream_yields_every_row_once(groups: dict[int, LocalWorkerGroup]) -> None:
    batch = _batch(7)  # 3 ranks: padded to 9
    items = list(groups[3].even.stream(batch))
    assert sorted(r for rs, _ in items for r in rs) == list(range(7))
    _same(groups[3].even.stream(batch).result(), groups[3].even(batch))


def test_sticky_routes_by_a_non_tensor_column(groups: dict[int, LocalWorkerGroup]) -> None:
    g = groups[3]
    batch = _batch(6)
    first = g.sticky(batch)
    assert list(first.non_tensor_batch["tag"]) == [f"r{i}!" for i in range(6)]
    owners = dict(zip(batch.non_tensor_batch["tag"], first.non_tensor_batch["rank"], strict=True))
    again = g.sticky(batch[[5, 3, 1, 0, 2, 4]])
    tags = [t[:-1] for t in again.non_tensor_batch["tag"]]
    assert [owners[t] for t in tags] == list(again.non_tensor_batch["rank"])
