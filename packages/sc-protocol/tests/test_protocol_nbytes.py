"""sc_dispatch.ext.payload_nbytes on sc-protocol's types: DataProto, TensorDict, futures,
tensors and numpy arrays, told by the registered adapters and hooks (no name sniffing)."""

from __future__ import annotations

import numpy as np
import torch
from _protocol_helpers import PROPERTY, make_dp
from hypothesis import given
from hypothesis import strategies as st
from sc_dispatch.ext import get_nbytes_fn, get_shard_adapter, payload_nbytes
from sc_protocol import DataProto, DataProtoFuture, DataProtoItem
from tensordict import TensorDict

#: make_dp's bytes per row: ids 3 x int64, logp 2 x bfloat16, mask 1 x bool, uid one object
#: pointer, score one float64.
ROW = 3 * 8 + 2 * 2 + 1 + np.dtype(object).itemsize + 8


@PROPERTY
@given(rows=st.integers(1, 40), chunks=st.integers(1, 5))
def test_a_batch_weighs_its_rows_and_its_chunks_add_up(rows: int, chunks: int) -> None:
    dp = make_dp(rows)
    assert payload_nbytes(dp) == ROW * rows
    if rows % chunks == 0:
        assert sum(payload_nbytes(c) for c in dp.chunk(chunks)) == payload_nbytes(dp)


def test_a_view_counts_only_its_own_rows() -> None:
    dp = make_dp(10)
    assert payload_nbytes(dp[2:5]) == 3 * ROW
    assert payload_nbytes(dp[[0, 0, 1]]) == 3 * ROW


def test_tensor_only_numpy_only_and_empty_batches() -> None:
    assert payload_nbytes(make_dp(4, non_tensors=False)) == 4 * (3 * 8 + 2 * 2 + 1)
    assert payload_nbytes(make_dp(4, tensors=False)) == 4 * (np.dtype(object).itemsize + 8)
    assert payload_nbytes(DataProto()) == 0


def test_nested_tensordict_leaves_are_counted() -> None:
    td = TensorDict(
        {
            "a": torch.zeros(4, 2),
            "inner": TensorDict({"b": torch.zeros(4, dtype=torch.int16)}, [4]),
        },
        batch_size=[4],
    )
    assert payload_nbytes(td) == 4 * 2 * 4 + 4 * 2
    assert payload_nbytes(DataProto(batch=td)) == payload_nbytes(td)


def test_tensors_and_arrays_through_their_hooks() -> None:
    t = torch.zeros(6, 4, dtype=torch.float32)
    assert payload_nbytes(t) == 96
    assert payload_nbytes(t[:, ::2]) == 48  # a strided view: its elements, not its storage
    assert payload_nbytes(torch.zeros(3, dtype=torch.bfloat16)) == 6
    assert payload_nbytes(torch.nn.Parameter(torch.zeros(5))) == 20  # a Tensor subclass
    assert payload_nbytes(np.zeros((2, 5), dtype=np.int32)) == 40
    assert get_nbytes_fn(t) is not None
    assert get_shard_adapter(t) is None  # sizing a type does not make it shardable


def test_a_future_weighs_nothing_until_resolved() -> None:
    future = DataProtoFuture.from_value(make_dp(8))
    assert payload_nbytes(future) == 0


def test_call_arguments_mix() -> None:
    dp = make_dp(2)
    args = [dp, {"weights": torch.ones(3)}, (np.ones(2), b"xyz"), "text", 7]
    assert payload_nbytes(args) == 2 * ROW + 12 + 16 + 3


def test_a_jagged_tensor_counts_its_values() -> None:
    nested = torch.nested.nested_tensor(
        [torch.zeros(2), torch.zeros(5)], layout=torch.jagged, dtype=torch.float32
    )
    assert payload_nbytes(nested) == 7 * 4


def test_a_row_weighs_its_tensors_and_numpy_values() -> None:
    item = make_dp(3)[1]
    assert isinstance(item, DataProtoItem)
    assert payload_nbytes(item) == 3 * 8 + 2 * 2 + 1 + 8  # the uid string is not an array
    assert payload_nbytes(DataProtoItem()) == 0
