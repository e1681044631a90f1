"""verl's fold_batch_dim / unfold_batch_dim, and union_numpy_dict on cyclic object arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _protocol_helpers import PROPERTY, assert_dp_equal, make_dp
from hypothesis import given
from hypothesis import strategies as st
from sc_protocol import (
    BatchSizeMismatchError,
    DataProto,
    InvalidSizeError,
    KeyConflictError,
    ProtocolTypeError,
    fold_batch_dim,
    unfold_batch_dim,
    union_numpy_dict,
)
from tensordict import TensorDict


@PROPERTY
@given(groups=st.integers(1, 6), per_group=st.integers(1, 5))
def test_fold_then_unfold_is_the_identity(groups: int, per_group: int) -> None:
    data = make_dp(groups * per_group)
    folded = fold_batch_dim(data, groups)
    assert len(folded) == groups
    assert folded.batch is not None
    assert folded.batch.batch_size == torch.Size([groups])
    assert folded.batch["ids"].shape == (groups, per_group, 3)
    assert folded.non_tensor_batch["uid"].shape == (groups, per_group)
    # Group g holds rows g * per_group ... (g + 1) * per_group - 1, in order.
    assert folded.non_tensor_batch["uid"][-1, -1] == f"u{groups * per_group - 1}"
    assert_dp_equal(unfold_batch_dim(folded, batch_dims=2), data)


def test_fold_and_unfold_leave_their_argument_alone_and_share_memory() -> None:
    data = make_dp(6)
    before = {k: v.shape for k, v in data.non_tensor_batch.items()}
    folded = fold_batch_dim(data, 2)
    assert {k: v.shape for k, v in data.non_tensor_batch.items()} == before
    assert data.batch is not None
    assert data.batch.batch_size == torch.Size([6])
    assert folded.batch is not None
    assert folded.batch["ids"].data_ptr() == data.batch["ids"].data_ptr()
    unfolded = unfold_batch_dim(folded)
    assert folded.batch.batch_size == torch.Size([2])
    assert folded.non_tensor_batch["uid"].shape == (2, 3)
    assert unfolded.meta_info == data.meta_info
    assert unfolded.meta_info is not data.meta_info


def test_fold_without_tensors_and_with_nested_tensordicts() -> None:
    only_numpy = make_dp(4, tensors=False)
    assert fold_batch_dim(only_numpy, 2).non_tensor_batch["score"].shape == (2, 2)
    nested = TensorDict(
        {"outer": TensorDict({"inner": torch.arange(8).reshape(4, 2)}, batch_size=[4])},
        batch_size=[4],
    )
    folded = fold_batch_dim(DataProto(batch=nested), 2)
    assert folded.batch is not None
    assert folded.batch["outer", "inner"].shape == (2, 2, 2)
    back = unfold_batch_dim(folded)
    assert back.batch is not None
    assert torch.equal(back.batch["outer", "inner"], nested["outer", "inner"])


def test_unfold_more_leading_dimensions() -> None:
    data = DataProto.from_dict({"x": torch.arange(24).reshape(2, 3, 4)})
    out = unfold_batch_dim(data, batch_dims=3)
    assert len(out) == 24
    assert out.batch is not None
    assert out.batch["x"].tolist() == list(range(24))


def test_fold_errors_name_the_values() -> None:
    data = make_dp(6)
    with pytest.raises(InvalidSizeError, match=r"fold_batch_dim: 6 rows do not fold into 4 groups"):
        fold_batch_dim(data, 4)
    for bad in (0, -1, True, 2.0, "2"):
        with pytest.raises(InvalidSizeError, match=r"new_batch_size must be an int >= 1, got"):
            fold_batch_dim(data, bad)  # type: ignore[arg-type]
    with pytest.raises(ProtocolTypeError, match=r"fold_batch_dim: expected a DataProto, got dict"):
        fold_batch_dim({"x": 1}, 2)  # type: ignore[type-var]
    with pytest.raises(InvalidSizeError, match=r"unfold_batch_dim: batch_dims must be an int >= 1"):
        unfold_batch_dim(data, 0)


def test_unfold_errors_name_the_column_and_shapes() -> None:
    data = DataProto.from_dict({"x": torch.zeros(2, 3), "y": torch.zeros(2, 4)})
    with pytest.raises(
        BatchSizeMismatchError, match=r"column 'y' has leading dimensions \[2, 4\], column 'x'"
    ) as info:
        unfold_batch_dim(data)
    assert isinstance(info.value, ValueError)
    flat = DataProto.from_dict({"x": torch.zeros(2)})
    with pytest.raises(BatchSizeMismatchError, match=r"column 'x' has shape \[2\], fewer than"):
        unfold_batch_dim(flat)
    with pytest.raises(InvalidSizeError, match=r"no columns to unfold"):
        unfold_batch_dim(DataProto())


def _holds_itself() -> np.ndarray:
    arr = np.array([None], dtype=object)
    arr[0] = arr
    return arr


def test_union_numpy_dict_of_arrays_that_hold_themselves() -> None:
    # verl treats a cycle met again as equal; sc did recurse until RecursionError.
    first, second = _holds_itself(), _holds_itself()
    merged = union_numpy_dict({"data": first}, {"data": second})
    assert list(merged) == ["data"]
    with pytest.raises(KeyConflictError, match=r"key 'data' has different values .*values differ"):
        union_numpy_dict({"data": first}, {"data": np.array([None], dtype=object)})
    # Lists that hold themselves, inside object columns.
    a: list[object] = [1]
    a.append(a)
    b: list[object] = [1]
    b.append(b)
    col_a, col_b = np.empty(1, dtype=object), np.empty(1, dtype=object)
    col_a[0], col_b[0] = a, b
    union_numpy_dict({"k": col_a}, {"k": col_b})
    c: list[object] = [2]
    c.append(c)
    col_c = np.empty(1, dtype=object)
    col_c[0] = c
    with pytest.raises(KeyConflictError):
        union_numpy_dict({"k": col_a}, {"k": col_c})


def test_union_numpy_dict_compares_nested_object_arrays_nan_and_containers() -> None:
    sub1, sub2 = np.array([1, 2]), np.array([3.0, np.nan])
    grid = np.array([[sub1, "text"], [sub2, None]], dtype=object)
    union_numpy_dict({"g": grid}, {"g": grid.copy()})
    other = np.array([[sub1, "text"], [np.array([3.0, 4.0]), None]], dtype=object)
    with pytest.raises(KeyConflictError):
        union_numpy_dict({"g": grid}, {"g": other})
    rows = np.empty(2, dtype=object)
    rows[0], rows[1] = [np.array([1.0, np.nan])], {"a": (1, float("nan"))}
    same = np.empty(2, dtype=object)
    same[0], same[1] = [np.array([1.0, np.nan])], {"a": (1, float("nan"))}
    union_numpy_dict({"r": rows}, {"r": same})
    same[1] = {"a": (1, 2.0)}
    with pytest.raises(KeyConflictError):
        union_numpy_dict({"r": rows}, {"r": same})
