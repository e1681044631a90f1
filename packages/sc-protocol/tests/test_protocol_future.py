"""DataProtoFuture: resolver API, shard slices by row count, lazy chunk / pad / unpad / concat."""

from __future__ import annotations

import concurrent.futures
import pickle
from typing import Any

import pytest
import torch
from _protocol_helpers import make_dp, row_ids
from sc_dispatch.ext import register_future_resolver
from sc_protocol import (
    DataProto,
    DataProtoFuture,
    FutureError,
    InvalidSizeError,
    ProtocolTypeError,
    UnknownRowCountError,
)
from sc_protocol.ext import ShardSlice, slice_shards
from tensordict import TensorDict


class Store:
    """A fake object store: refs are names; ``resolve`` records every fetch."""

    def __init__(self, shards: dict[str, DataProto]) -> None:
        self.shards = shards
        self.fetched: list[list[str]] = []

    def resolve(self, refs: list[Any]) -> list[DataProto]:
        self.fetched.append(list(refs))
        return [self.shards[r] for r in refs]


def three_shards() -> tuple[Store, DataProtoFuture]:
    dp = make_dp(9)
    store = Store({"r0": dp[0:4], "r1": dp[4:6], "r2": dp[6:9]})
    fut = DataProtoFuture.from_shards(["r0", "r1", "r2"], [4, 2, 3], store.resolve)
    return store, fut


def test_slice_shards() -> None:
    assert slice_shards([4, 2, 3], 3, 7) == [
        ShardSlice(0, 3, 4),
        ShardSlice(1, 0, 2),
        ShardSlice(2, 0, 1),
    ]
    assert slice_shards([4, 2, 3], 4, 6) == [ShardSlice(1, 0, 2)]
    assert slice_shards([4, 0, 3], 0, 0) == []
    with pytest.raises(
        InvalidSizeError,
        match=r"row range 5:10 is not within the 9 rows of shards with row counts \[4, 2, 3\]",
    ):
        slice_shards([4, 2, 3], 5, 10)
    with pytest.raises(
        InvalidSizeError, match=r"row_counts\[1\] must be a non-negative int, got -1"
    ):
        slice_shards([1, -1], 0, 0)


def test_get_joins_shards_in_order() -> None:
    store, fut = three_shards()
    assert len(fut) == 9
    assert fut.num_rows == 9
    assert fut.row_counts == (4, 2, 3)
    assert fut.shard_refs == ("r0", "r1", "r2")
    assert fut.futures == ["r0", "r1", "r2"]
    value = fut.get()
    assert row_ids(value) == list(range(9))
    assert fut.get() is value  # cached
    assert store.fetched == [["r0", "r1", "r2"]]


def test_chunk_fetches_only_needed_shards() -> None:
    store, fut = three_shards()
    parts = fut.chunk(2)
    assert [p.num_rows for p in parts] == [5, 4]
    assert parts[0].shard_refs == ("r0", "r1")
    assert parts[0].slices == (ShardSlice(0, 0, 4), ShardSlice(1, 0, 1))
    assert parts[1].shard_refs == ("r1", "r2")
    assert parts[1].row_counts == (2, 3)
    assert row_ids(parts[1].get()) == [5, 6, 7, 8]
    assert store.fetched == [["r1", "r2"]]
    assert parts[1].shard_slices(0, 2) == [ShardSlice(0, 1, 2), ShardSlice(1, 0, 1)]


def test_chunk_then_concat_merges_into_one_list_of_slices() -> None:
    store, fut = three_shards()
    merged = DataProtoFuture.concat(fut.chunk(3))
    assert merged.shard_refs == ("r0", "r1", "r2")
    assert merged.num_rows == 9
    assert row_ids(merged.get()) == list(range(9))
    assert store.fetched == [["r0", "r1", "r2"]]


def test_pad_and_unpad_are_lazy() -> None:
    _, fut = three_shards()
    padded = fut.pad(11)
    assert padded.num_rows == 20
    assert row_ids(padded.get()) == list(range(9)) * 2 + [0, 1]
    unpadded = padded.unpad(11)
    assert unpadded.num_rows == 9
    assert row_ids(unpadded.get()) == list(range(9))
    assert fut.pad(0) is fut
    assert fut.unpad(0) is fut
    last = fut.unpad(7)
    assert last.shard_refs == ("r0",)
    assert row_ids(last.get()) == [0, 1]


def test_slice() -> None:
    _, fut = three_shards()
    part = fut.slice(3, 5)
    assert part.shard_refs == ("r0", "r1")
    assert row_ids(part.get()) == [3, 4]
    empty = fut.slice(4, 4)
    assert len(empty) == 0
    assert len(empty.get()) == 0


def test_unknown_row_counts_defer_everything() -> None:
    dp = make_dp(7)
    store = Store({"a": dp[:3], "b": dp[3:]})
    fut = DataProtoFuture.from_shards(["a", "b"], None, store.resolve)
    assert fut.num_rows is None
    assert fut.slices is None
    with pytest.raises(
        UnknownRowCountError, match=r"row count is unknown \(shard row counts \[None, None\]\)"
    ):
        len(fut)
    with pytest.raises(UnknownRowCountError, match=r"not all known"):
        fut.shard_slices(0, 1)
    assert bool(fut)
    parts = fut.chunk(3)
    assert [row_ids(p.get()) for p in parts] == [[0, 1, 2], [3, 4], [5, 6]]
    padded = fut.pad(3)
    assert row_ids(padded.get()) == [*range(7), 0, 1, 2]
    assert row_ids(padded.unpad(3).get()) == list(range(7))
    assert row_ids(fut.slice(2, 4).get()) == [2, 3]
    mixed = DataProtoFuture.concat([parts[2], DataProtoFuture.from_value(make_dp(1))])
    assert mixed.num_rows is None
    assert row_ids(mixed.get()) == [5, 6, 0]
    assert mixed.shard_refs == ("a", "b", mixed.shard_refs[2])
    assert mixed.row_counts == (None, None, 1)


def test_partly_known_counts_and_composite_lengths() -> None:
    dp = make_dp(4)
    known = DataProtoFuture.from_value(dp[:2])
    unknown = DataProtoFuture.from_shards([dp[2:]])
    joined = DataProtoFuture.concat([known, unknown])
    assert joined.num_rows is None
    known_pair = DataProtoFuture.concat(
        [known, DataProtoFuture(futures=[dp[2:]], row_counts=[2], resolve=lambda r: r)]
    )
    assert known_pair.num_rows == 4
    assert row_ids(known_pair.get()) == [0, 1, 2, 3]
    assert DataProtoFuture.concat([known]) is known


def test_verl_style_constructor_and_dispatch_fn() -> None:
    dp = make_dp(4)
    fut = DataProtoFuture(DataProto.concat, [dp[:2], dp[2:]])
    assert fut.collect_fn is DataProto.concat
    assert row_ids(fut.get()) == [0, 1, 2, 3]
    second_half = DataProtoFuture(
        collect_fn=DataProto.concat, futures=[dp[:2], dp[2:]], dispatch_fn=lambda x: x.chunk(2)[1]
    )
    assert second_half.num_rows is None
    assert row_ids(second_half.get()) == [2, 3]
    raw = DataProtoFuture.concat([dp[:1], dp[1:]])
    assert row_ids(raw.get()) == [0, 1, 2, 3]


def test_default_resolver_accepts_concurrent_futures_and_get() -> None:
    dp = make_dp(3)
    cf: concurrent.futures.Future[DataProto] = concurrent.futures.Future()
    cf.set_result(dp[:1])

    class HasGet:
        def get(self) -> DataProto:
            return dp[1:]

    fut = DataProtoFuture.from_shards([cf, HasGet()], [1, 2])
    assert row_ids(fut.get()) == [0, 1, 2]


def test_pickle_drops_cached_value_and_keeps_slices() -> None:
    dp = make_dp(4)
    fut = DataProtoFuture.from_shards([dp[:2], dp[2:]], [2, 2]).chunk(2)[1]
    fut.get()
    clone = pickle.loads(pickle.dumps(fut, protocol=5))
    assert clone._value is None
    assert clone.slices == fut.slices
    assert row_ids(clone.get()) == [2, 3]


def test_repr() -> None:
    _, fut = three_shards()
    assert repr(fut) == "DataProtoFuture(shards=3, row_counts=[4, 2, 3], rows=9)"


def test_future_errors() -> None:
    dp = make_dp(4)
    with pytest.raises(FutureError, match=r"2 shards but 1 row counts \[2\]"):
        DataProtoFuture.from_shards([dp, dp], [2])
    with pytest.raises(
        InvalidSizeError, match=r"row_counts\[0\] must be a non-negative int, got -2"
    ):
        DataProtoFuture.from_shards([dp], [-2])
    with pytest.raises(ProtocolTypeError, match=r"resolve must be callable"):
        DataProtoFuture.from_shards([dp], [4], "ray.get")  # type: ignore[arg-type]
    with pytest.raises(ProtocolTypeError, match=r"collect_fn must be callable"):
        DataProtoFuture(collect_fn=3)  # type: ignore[arg-type]
    with pytest.raises(ProtocolTypeError, match=r"dispatch_fn must be callable"):
        DataProtoFuture(dispatch_fn=3)  # type: ignore[arg-type]
    with pytest.raises(ProtocolTypeError, match=r"expected a DataProto, got int"):
        DataProtoFuture.from_value(3)  # type: ignore[arg-type]
    with pytest.raises(FutureError, match=r"shard 0 has 4 rows, 3 were announced"):
        DataProtoFuture.from_shards([dp], [3]).get()
    with pytest.raises(FutureError, match=r"resolver returned 1 values for 2 shards"):
        DataProtoFuture.from_shards(["a", "b"], [1, 1], lambda refs: [dp]).get()
    with pytest.raises(FutureError, match=r"shard 0 resolved to a int, not a DataProto"):
        DataProtoFuture.from_shards(["a"], None, lambda refs: [1]).get()
    with pytest.raises(
        FutureError, match=r"shard 0 is a str, which no resolver handles; .* pass resolve="
    ):
        DataProtoFuture.from_shards(["a"], [1]).get()
    with pytest.raises(FutureError, match=r"collect_fn returned a list, not a DataProto"):
        DataProtoFuture(collect_fn=list, futures=[dp]).get()
    with pytest.raises(FutureError, match=r"dispatch_fn returned a int, not a DataProto"):
        DataProtoFuture(DataProto.concat, [dp], dispatch_fn=lambda x: 1).get()  # type: ignore[arg-type,return-value]
    fut = DataProtoFuture.from_shards([dp], [4])
    with pytest.raises(InvalidSizeError, match=r"chunks must be >= 1, got 0"):
        fut.chunk(0)
    with pytest.raises(ProtocolTypeError, match=r"chunks must be an int"):
        fut.chunk("2")  # type: ignore[arg-type]
    with pytest.raises(InvalidSizeError, match=r"cannot split 4 rows into 5 chunks"):
        fut.chunk(5)
    with pytest.raises(InvalidSizeError, match=r"cannot drop 5 rows from 4"):
        fut.unpad(5)
    with pytest.raises(InvalidSizeError, match=r"row range 2:9 is not within 4 rows"):
        fut.slice(2, 9)
    with pytest.raises(InvalidSizeError, match=r"start 3 > stop 2"):
        fut.slice(3, 2)
    with pytest.raises(InvalidSizeError, match=r"row range 0:5 is not within 4 rows"):
        fut.shard_slices(0, 5)
    with pytest.raises(InvalidSizeError, match=r"cannot pad an empty batch with 2 rows"):
        DataProtoFuture.from_shards([dp[:0]], [0]).pad(2)
    with pytest.raises(InvalidSizeError, match=r"nothing to concatenate"):
        DataProtoFuture.concat([])
    with pytest.raises(ProtocolTypeError, match=r"mix of DataProtoFutures and raw shard handles"):
        DataProtoFuture.concat([fut, dp])
    unknown = DataProtoFuture.from_shards(["a"], None, lambda refs: [dp])
    with pytest.raises(FutureError, match=r"row range 2:9 is not within the 4 rows that resolved"):
        unknown.slice(2, 9).get()
    with pytest.raises(FutureError, match=r"cannot drop 9 padding rows from 4 rows"):
        unknown.unpad(9).get()
    with pytest.raises(FutureError, match=r"cannot pad an empty result with 2 rows"):
        DataProtoFuture.from_shards(["a"], None, lambda refs: [dp[:0]]).pad(2).get()


def test_empty_future_resolves_to_empty_batch() -> None:
    assert len(DataProtoFuture().get()) == 0
    assert len(DataProtoFuture.from_shards([]).get()) == 0


class _Handle:
    """A backend's shard handle type: no get(), resolved only through a registered resolver."""

    def __init__(self, value: DataProto) -> None:
        self.value = value


def test_registered_resolver_fetches_handles_in_bulk_without_resolve_argument() -> None:
    calls: list[int] = []

    def resolve(handles: list[Any]) -> list[Any]:
        calls.append(len(handles))
        return [h.value for h in handles]

    handles = [_Handle(make_dp(2)), _Handle(make_dp(2))]
    with pytest.raises(FutureError, match=r"_Handle, which no resolver handles"):
        DataProtoFuture(futures=handles).get()
    register_future_resolver(_Handle, resolve)
    # verl's spellings: the constructor with collect_fn and futures, concat, chunk, get.
    fut = DataProtoFuture(collect_fn=DataProto.concat, futures=handles)
    assert len(fut.get()) == 4
    assert calls == [2]  # one bulk call for both shards
    parts = DataProtoFuture.concat(handles).chunk(2)
    assert [len(p.get()) for p in parts] == [2, 2]
    with pytest.raises(TypeError, match=r"expected a class"):
        register_future_resolver("x", resolve)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"resolve must be callable"):
        register_future_resolver(_Handle, 3)  # type: ignore[arg-type]


def _td(start: int, stop: int) -> TensorDict:
    return TensorDict({"x": torch.arange(start, stop)}, batch_size=[stop - start])


def test_a_future_of_tensordict_shards_resolves_to_the_joined_tensordict() -> None:
    # verl's future joins TensorDicts as well as DataProtos.
    shards = {"a": _td(0, 3), "b": _td(3, 5), "c": _td(5, 9)}
    store = Store(shards)  # type: ignore[arg-type]
    fut: DataProtoFuture[TensorDict] = DataProtoFuture.from_shards(
        ["a", "b", "c"], [3, 2, 4], store.resolve
    )
    value = fut.get()
    assert isinstance(value, TensorDict)
    assert value["x"].tolist() == list(range(9))
    parts = fut.chunk(3)
    assert [p.get()["x"].tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert store.fetched[-2:] == [["b", "c"], ["c"]]  # each part fetches its shards only
    assert fut.pad(2).unpad(2).get()["x"].tolist() == list(range(9))
    # Unknown row counts: the operations are recorded and applied to the joined TensorDict.
    unknown: DataProtoFuture[TensorDict] = DataProtoFuture.from_shards(
        ["a", "c"], None, store.resolve
    )
    assert unknown.pad(1).get()["x"].tolist() == [0, 1, 2, 5, 6, 7, 8, 0]
    assert unknown.chunk(2)[1].get()["x"].tolist() == [6, 7, 8]
    assert DataProtoFuture.concat([parts[2], parts[0]]).get()["x"].tolist() == [6, 7, 8, 0, 1, 2]
    verl_style: DataProtoFuture[TensorDict] = DataProtoFuture(futures=[_td(0, 2), _td(2, 3)])
    assert verl_style.get()["x"].tolist() == [0, 1, 2]


def test_a_future_of_mixed_or_foreign_shards_is_an_error_naming_them() -> None:
    mixed = DataProtoFuture.from_shards([make_dp(2), _td(0, 2)], [2, 2])
    with pytest.raises(FutureError, match=r"cannot join shards of different kinds"):
        mixed.get()
    foreign = DataProtoFuture.from_shards([[1, 2]], [2], resolve=lambda refs: refs)
    with pytest.raises(
        FutureError, match=r"shard 0 resolved to a list, not a DataProto or a TensorDict"
    ):
        foreign.get()
    wrong_rows = DataProtoFuture.from_shards([_td(0, 2)], [3])
    with pytest.raises(FutureError, match=r"shard 0 has 2 rows, 3 were announced"):
        wrong_rows.get()


def _storage(value: DataProto | TensorDict) -> int:
    """Where the first tensor column's memory lies."""
    td = value if isinstance(value, TensorDict) else value.batch
    assert td is not None
    column: torch.Tensor = td[next(iter(td.keys()))]
    return int(column.untyped_storage().data_ptr())


def test_a_futures_value_never_aliases_a_fetched_shard() -> None:
    # Other readers of a shard (Ray's object store) see the same memory: writing into the
    # value must not change it. One piece is cloned once; a join is new memory already.
    dp = make_dp(4)
    td = _td(0, 4)
    for shard in (dp, td):
        whole = DataProtoFuture.from_shards([shard], [4]).get()
        part = DataProtoFuture.from_shards([shard], [4]).slice(1, 3).get()
        deferred = DataProtoFuture.from_shards([shard]).get()
        for value in (whole, part, deferred):
            assert _storage(value) != _storage(shard)
    joined = DataProtoFuture.from_shards([dp[:2], dp[2:]], [2, 2]).get()
    assert row_ids(joined) == [0, 1, 2, 3]
