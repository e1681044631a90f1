"""The shardable seam: adapters, chunk sizes, split_args_kwargs, unpad_output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import sc_dispatch as scd
from _dispatch_fakes import BATCH_ADAPTER, PROPERTY, Batch, FakeWorkerGroup, run_call
from hypothesis import given
from hypothesis import strategies as st
from sc_dispatch import ext, verl


class SubBatch(Batch):
    """Inherits Batch's adapter through the MRO."""


class Rows:
    """A container registered only inside one test."""

    def __init__(self, rows: Sequence[int]) -> None:
        self.rows = list(rows)


class RowsAdapter:
    def length(self, obj: Rows) -> int:
        return len(obj.rows)

    def chunk(self, obj: Rows, chunks: int) -> list[Rows]:
        sizes = ext.chunk_sizes(len(obj.rows), chunks)
        starts = [sum(sizes[:i]) for i in range(chunks)]
        return [Rows(obj.rows[s : s + n]) for s, n in zip(starts, sizes, strict=True)]

    def concat(self, parts: Sequence[Rows]) -> Rows:
        return Rows([r for p in parts for r in p.rows])

    def pad(self, obj: Rows, pad_size: int) -> Rows:
        return Rows(obj.rows + obj.rows[:pad_size])

    def unpad(self, obj: Rows, pad_size: int) -> Rows:
        return Rows(obj.rows[: len(obj.rows) - pad_size])

    def auto_padding(self, obj: Rows) -> bool:
        return True


class BrokenAdapter(RowsAdapter):
    def chunk(self, obj: Rows, chunks: int) -> list[Rows]:
        return [obj]


def test_chunk_sizes_examples() -> None:
    assert ext.chunk_sizes(7, 3) == [3, 2, 2]
    assert ext.chunk_sizes(6, 3) == [2, 2, 2]
    assert ext.chunk_sizes(2, 4) == [1, 1, 0, 0]


@PROPERTY
@given(st.integers(0, 200), st.integers(1, 32))
def test_chunk_sizes_are_balanced_and_front_loaded(length: int, chunks: int) -> None:
    sizes = ext.chunk_sizes(length, chunks)
    assert len(sizes) == chunks
    assert sum(sizes) == length
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


def test_builtin_adapters() -> None:
    assert ext.is_shardable([1])
    assert ext.is_shardable(())
    assert not ext.is_shardable("abc")
    assert not ext.is_shardable({"a": 1})
    assert ext.get_shard_adapter(Batch([])) is BATCH_ADAPTER
    assert ext.get_shard_adapter(SubBatch([])) is BATCH_ADAPTER  # found through the MRO
    assert ext.get_shard_adapter(3) is None


def test_register_shardable_teaches_splitting_modes_and_replaces() -> None:
    assert not ext.is_shardable(Rows([]))
    with pytest.raises(scd.NotShardableError, match=r"type Rows cannot be split"):
        verl.dispatch_dp_compute_data_proto(FakeWorkerGroup(2), Rows([1, 2]))
    adapter = RowsAdapter()
    ext.register_shardable(Rows, adapter)
    assert ext.get_shard_adapter(Rows([])) is adapter
    out = run_call(
        FakeWorkerGroup(2), scd.Dispatch.DP_COMPUTE_PROTO, lambda r, d: d, Rows([1, 2, 3])
    )
    assert out.rows == [1, 2, 3]
    broken = BrokenAdapter()
    ext.register_shardable(Rows, broken)
    assert ext.get_shard_adapter(Rows([])) is broken
    with pytest.raises(
        scd.DispatchArgumentError,
        match=r"adapter for Rows returned 1 shards, "
        r"expected 2",
    ):
        verl.dispatch_dp_compute_data_proto(FakeWorkerGroup(2), Rows([1, 2]))


def test_sequence_padding_cycles_and_keeps_type() -> None:
    adapter = ext.get_shard_adapter([])
    tuple_adapter = ext.get_shard_adapter(())
    assert adapter is not None
    assert tuple_adapter is not None
    assert adapter.pad([1, 2], 5) == [1, 2, 1, 2, 1, 2, 1]
    assert tuple_adapter.pad((1,), 2) == (1, 1, 1)
    original = [1, 2]
    assert adapter.pad(original, 0) is original
    adapter.pad(original, 3)
    assert original == [1, 2]
    assert adapter.unpad([1, 2, 3], 2) == [1]
    assert tuple_adapter.unpad((1, 2, 3), 1) == (1, 2)
    assert tuple_adapter.concat([(1,), (2, 3)]) == (1, 2, 3)
    assert adapter.concat([[1], [2, 3]]) == [1, 2, 3]
    assert adapter.auto_padding([1]) is False
    with pytest.raises(scd.DispatchArgumentError, match=r"cannot pad an empty sequence"):
        adapter.pad([], 1)


def test_split_args_kwargs_directly() -> None:
    args, kwargs, pad = ext.split_args_kwargs(
        "MODE", 2, (Batch([1, 2, 3]),), {"x": scd.Rows([4, 5, 6])}
    )
    assert pad == 1
    assert [b.rows for b in args[0]] == [(1, 2), (3, 1)]
    assert kwargs == {"x": [[4, 5], [6, 4]]}
    assert ext.split_args_kwargs("MODE", 3, (), {}) == ([], {}, 0)
    with pytest.raises(scd.NotShardableError, match=r"keyword argument 'x' is a list"):
        ext.split_args_kwargs("MODE", 2, (Batch([1, 2]),), {"x": [4, 5]})
    args, kwargs, _ = ext.split_args_kwargs(
        "MODE", 2, (Batch([1, 2]),), {"x": [4, 5]}, allow_sequences=True
    )
    assert kwargs == {"x": [[4], [5]]}


def test_split_args_kwargs_allow_padding_false() -> None:
    args, _, pad = ext.split_args_kwargs("MODE", 2, (Batch([1, 2, 3, 4]),), {}, allow_padding=False)
    assert pad == 0
    assert [b.rows for b in args[0]] == [(1, 2), (3, 4)]
    with pytest.raises(scd.DispatchArgumentError, match=r"MODE: a batch of 3 rows does not"):
        ext.split_args_kwargs("MODE", 2, (Batch([1, 2, 3]),), {}, allow_padding=False)


def test_one_auto_padding_argument_pads_the_whole_call() -> None:
    no_pad = Batch([1, 2, 3], auto_pad=False)
    args, _, pad = ext.split_args_kwargs("MODE", 2, (no_pad, Batch([4, 5, 6])), {})
    assert pad == 1
    assert [b.rows for b in args[0]] == [(1, 2), (3, 1)]
    with pytest.raises(scd.DispatchArgumentError, match=r"3 rows does not divide evenly into 2"):
        ext.split_args_kwargs("MODE", 2, (no_pad, scd.Rows([4, 5, 6])), {})


def test_unpad_output() -> None:
    assert ext.unpad_output([1, 2, 3], 1) == [1, 2]
    assert ext.unpad_output(Batch([1, 2, 3]), 2) == Batch([1])
    marker: dict[str, Any] = {"loss": 1.0}
    assert ext.unpad_output(marker, 2) is marker  # not shardable: left alone
    same = [1, 2]
    assert ext.unpad_output(same, 0) is same


class Pending:
    """A future-like container whose row count is not known until it resolves."""

    def __init__(self, parts: int = 1, pad: int = 0) -> None:
        self.parts = parts
        self.pad = pad


class PendingAdapter:
    def length(self, obj: Pending) -> int | None:
        return None

    def chunk(self, obj: Pending, chunks: int) -> list[Pending]:
        return [Pending(chunks, obj.pad) for _ in range(chunks)]

    def concat(self, parts: Sequence[Pending]) -> Pending:
        return Pending(len(parts))

    def pad(self, obj: Pending, pad_size: int) -> Pending:
        return Pending(obj.parts, obj.pad + pad_size)

    def unpad(self, obj: Pending, pad_size: int) -> Pending:
        return obj

    def auto_padding(self, obj: Pending) -> bool:
        return False


ext.register_shardable(Pending, PendingAdapter())


def test_unknown_length_is_split_lazily_into_any_number_of_shards() -> None:
    args, _, pad = ext.split_args_kwargs("MODE", 5, (Pending(),), {})
    assert pad == 0
    assert [p.parts for p in args[0]] == [5] * 5


def test_unknown_length_is_padded_with_the_known_arguments() -> None:
    args, kwargs, pad = ext.split_args_kwargs("MODE", 2, (Pending(),), {"b": Batch([1, 2, 3])})
    assert pad == 1
    assert [p.pad for p in args[0]] == [1, 1]
    assert [b.rows for b in kwargs["b"]] == [(1, 2), (3, 1)]
    with pytest.raises(
        scd.DispatchArgumentError,
        match=r"same length, got positional argument "
        r"0: None, keyword argument 'b': 3, keyword argument 'c': 2",
    ):
        ext.split_args_kwargs(
            "MODE", 2, (Pending(),), {"b": Batch([1, 2, 3]), "c": scd.Rows([1, 2])}
        )
