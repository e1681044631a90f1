"""Hypothesis invariants over random shapes, dtypes and non-tensor columns."""

from __future__ import annotations

import itertools
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from _protocol_helpers import PROPERTY, assert_dp_equal, data_protos
from hypothesis import given
from hypothesis import strategies as st
from sc_protocol import (
    DataProto,
    DataProtoConfig,
    DataProtoFuture,
    InvalidSizeError,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)


@PROPERTY
@given(data_protos(min_rows=1), st.integers(1, 9))
def test_chunk_concat_roundtrip(dp: DataProto, chunks: int) -> None:
    chunks = min(chunks, len(dp))
    if len(dp) % chunks:
        with pytest.raises(InvalidSizeError, match="do not divide evenly"):
            dp.chunk(chunks)
        dp.meta_info[DataProtoConfig.auto_padding_key] = True  # uneven parts on request
    parts = dp.chunk(chunks)
    assert len(parts) == chunks
    sizes = [len(p) for p in parts]
    assert sizes == [len(a) for a in np.array_split(np.arange(len(dp)), chunks)]
    assert_dp_equal(DataProto.concat(parts), dp)


@PROPERTY
@given(data_protos(min_rows=1), st.integers(1, 8))
def test_pad_unpad_roundtrip(dp: DataProto, divisor: int) -> None:
    padded, pad = pad_dataproto_to_divisor(dp, divisor)
    assert len(padded) % divisor == 0
    assert 0 <= pad < divisor
    assert len(padded) == len(dp) + pad
    assert_dp_equal(unpad_dataproto(padded, pad), dp)


@PROPERTY
@given(data_protos(), st.sampled_from([2, 4, 5]), st.booleans())
def test_pickle_roundtrip(dp: DataProto, protocol: int, out_of_band: bool) -> None:
    if out_of_band and protocol == 5:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
        out = pickle.loads(data, buffers=buffers)
    else:
        out = pickle.loads(pickle.dumps(dp, protocol=protocol))
    assert_dp_equal(out, dp)
    assert out.meta_info == dp.meta_info
    if dp.batch is not None:
        assert out.batch is not None
        assert out.batch.batch_size == dp.batch.batch_size
        assert out.batch.device == dp.batch.device


@PROPERTY
@given(data_protos())
def test_save_load_roundtrip(dp: DataProto) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "b.pt"
        dp.save_to_disk(path)
        out = DataProto.load_from_disk(path, weights_only=True)
    assert_dp_equal(out, dp)
    assert out.meta_info == dp.meta_info


@PROPERTY
@given(data_protos(min_rows=1), st.data())
def test_index_and_select(dp: DataProto, data: st.DataObject) -> None:
    n = len(dp)
    idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=12))
    positions = [i % n for i in idx]
    for index in (idx, np.array(idx, dtype=np.int64), torch.tensor(idx, dtype=torch.int64)):
        sub = dp[index]
        assert len(sub) == len(idx)
        assert_dp_equal(
            sub, DataProto.concat([dp[p : p + 1] for p in positions]) if positions else sub
        )
    mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    masked = dp[np.array(mask, dtype=bool)]
    assert len(masked) == sum(mask)
    row = data.draw(st.integers(-n, n - 1))
    item = dp[row]
    for key, col in dp.non_tensor_batch.items():
        expected = col[row]
        got = item.non_tensor_batch[key]
        assert got is expected or np.array_equal(np.asarray(got), np.asarray(expected))
    if dp.batch is not None:
        assert item.batch is not None
        keys = list(dp.batch.keys())
        chosen = data.draw(st.lists(st.sampled_from(keys), unique=True)) if keys else []
        sel = dp.select(batch_keys=chosen)
        assert sel.batch is not None
        assert sorted(sel.batch.keys()) == sorted(chosen)
        for key in keys:
            assert torch.equal(item.batch[key], dp.batch[key][row])


@PROPERTY
@given(
    data_protos(min_rows=1), st.lists(st.integers(0, 5), min_size=1, max_size=4), st.integers(1, 6)
)
def test_future_chunks_equal_dataproto_chunks(dp: DataProto, cuts: list[int], chunks: int) -> None:
    n = len(dp)
    chunks = min(chunks, n)
    bounds = sorted({0, n, *[c % (n + 1) for c in cuts]})
    shards = [dp.slice(a, b) for a, b in itertools.pairwise(bounds)]
    fut = DataProtoFuture.from_shards(shards, [len(s) for s in shards])
    DataProtoConfig.auto_padding = True  # uneven chunks to compare with (conftest resets it)
    for part_f, part_d in zip(fut.chunk(chunks), dp.chunk(chunks), strict=True):
        assert part_f.num_rows == len(part_d)
        assert len(part_f.shard_refs) <= len(shards)
        assert_dp_equal(part_f.get(), part_d)
    unknown = DataProtoFuture.from_shards(shards)
    for part_f, part_d in zip(unknown.chunk(chunks), dp.chunk(chunks), strict=True):
        assert_dp_equal(part_f.get(), part_d)
