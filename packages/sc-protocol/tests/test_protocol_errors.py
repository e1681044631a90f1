"""Every misuse raises a typed exception that names the key and the sizes."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import sc_protocol._errors as errors_module
import torch
from _protocol_helpers import make_dp
from sc_dispatch._setting import SettingValueError
from sc_protocol import (
    BatchSizeMismatchError,
    DataProto,
    DataProtoConfig,
    FutureError,
    IndexOutOfRangeError,
    InvalidSizeError,
    KeyConflictError,
    KeyMismatchError,
    MissingKeyError,
    ProtocolTypeError,
    ScProtocolError,
    SerializationError,
    UnknownRowCountError,
    collate_fn,
    pad_dataproto_to_divisor,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)
from tensordict import TensorDict

ALL_ERRORS = [
    BatchSizeMismatchError,
    FutureError,
    IndexOutOfRangeError,
    InvalidSizeError,
    KeyConflictError,
    KeyMismatchError,
    MissingKeyError,
    ProtocolTypeError,
    SerializationError,
    UnknownRowCountError,
]


MEANINGS = (ValueError, TypeError, KeyError, IndexError, LookupError, NotImplementedError)

EXPECTED_MEANING: dict[type[Exception], type[Exception]] = {
    BatchSizeMismatchError: ValueError,
    FutureError: ValueError,
    IndexOutOfRangeError: IndexError,
    InvalidSizeError: ValueError,
    KeyConflictError: ValueError,
    KeyMismatchError: ValueError,
    MissingKeyError: KeyError,
    ProtocolTypeError: TypeError,
    SerializationError: ValueError,
    UnknownRowCountError: ValueError,
}


def _meanings(exc: type[BaseException]) -> list[type[BaseException]]:
    found = [m for m in MEANINGS if issubclass(exc, m)]
    return [m for m in found if not any(o is not m and issubclass(o, m) for o in found)]


def test_tree_is_documented_and_rooted() -> None:
    doc = errors_module.__doc__ or ""
    for exc in [ScProtocolError, *ALL_ERRORS]:
        assert exc.__name__ in doc
        assert issubclass(exc, ScProtocolError)
    assert ScProtocolError.__bases__ == (Exception,)
    assert issubclass(UnknownRowCountError, FutureError)


@pytest.mark.parametrize("exc", ALL_ERRORS)
def test_each_error_means_exactly_one_builtin(exc: type[Exception]) -> None:
    assert _meanings(exc) == [EXPECTED_MEANING[exc]]


def test_missing_key_message_is_not_quoted() -> None:
    assert str(MissingKeyError("key 'x' not found")) == "key 'x' not found"
    assert str(MissingKeyError()) == ""


# --- construction ------------------------------------------------------------------------


def test_tensor_columns_with_different_rows() -> None:
    with pytest.raises(
        BatchSizeMismatchError, match=r"tensor 'b' has batch size \(3,\), tensor 'a' has \(2,\)"
    ):
        DataProto.from_dict({"a": torch.zeros(2), "b": torch.zeros(3)})


def test_non_tensor_column_with_different_rows() -> None:
    with pytest.raises(
        BatchSizeMismatchError,
        match=r"non-tensor column 'u' has 3 rows, but the tensor batch has 2 rows",
    ):
        DataProto.from_dict({"a": torch.zeros(2)}, {"u": np.arange(3)})


def test_non_tensor_columns_disagree_without_tensors() -> None:
    with pytest.raises(
        BatchSizeMismatchError, match=r"'v' has 1 rows, but non-tensor column 'u' has 2 rows"
    ):
        DataProto.from_dict(non_tensors={"u": np.arange(2), "v": np.arange(1)})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch": {"a": torch.zeros(2)}}, r"batch must be a TensorDict or None, got dict"),
        (
            {"non_tensor_batch": [1, 2]},
            r"non_tensor_batch must be a dict of numpy arrays, got list",
        ),
        ({"meta_info": [1]}, r"meta_info must be a dict, got list"),
        (
            {"non_tensor_batch": {"u": 3}},
            r"non-tensor column 'u' must be a numpy array \(or a list\), got int",
        ),
        ({"non_tensor_batch": {"u": np.array(3)}}, r"non-tensor column 'u' is a 0-d numpy array"),
    ],
)
def test_constructor_type_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ProtocolTypeError, match=match):
        DataProto(**kwargs)


def test_check_consistency_on_mutated_object() -> None:
    dp = make_dp(2)
    dp.non_tensor_batch["bad"] = [1, 2]  # type: ignore[assignment]
    with pytest.raises(ProtocolTypeError, match=r"'bad' must be a numpy array, got list"):
        dp.check_consistency()


def test_batch_without_batch_dimension() -> None:
    with pytest.raises(BatchSizeMismatchError, match=r"batch has 0 batch dimensions \[\]"):
        DataProto(batch=TensorDict({"a": torch.zeros(2)}, batch_size=[]))


@pytest.mark.parametrize("non_tensors", [{}, {"u": np.arange(2)}])
def test_more_than_one_batch_dimension_is_refused_as_in_verl(
    non_tensors: dict[str, np.ndarray],
) -> None:
    td = TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3])
    expected = r"batch has 2 batch dimensions \[2, 3\]; a DataProto has exactly one"
    with pytest.raises(BatchSizeMismatchError, match=expected) as info:
        DataProto(batch=td, non_tensor_batch=non_tensors)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("dims", [0, 2, 3, True, 1.0, "1"])
def test_num_batch_dims_other_than_one_is_refused_naming_the_value(dims: object) -> None:
    expected = rf"from_dict: num_batch_dims must be 1 .*got {re.escape(repr(dims))}"
    with pytest.raises(InvalidSizeError, match=expected):
        DataProto.from_dict({"a": torch.zeros(2, 3)}, num_batch_dims=dims)  # type: ignore[arg-type]
    td = TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3])
    with pytest.raises(InvalidSizeError, match=r"from_tensordict: num_batch_dims must be 1"):
        DataProto.from_tensordict(td, num_batch_dims=dims)  # type: ignore[arg-type]


def test_from_dict_errors() -> None:
    with pytest.raises(
        ProtocolTypeError, match=r"tensor column 'a' must be a torch.Tensor, got list"
    ):
        DataProto.from_dict({"a": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(BatchSizeMismatchError, match=r"tensor 'a' has 0 dimensions"):
        DataProto.from_dict({"a": torch.tensor(1.0)})
    with pytest.raises(
        ProtocolTypeError, match=r"value of 'a' must be a torch.Tensor or a numpy array, got list"
    ):
        DataProto.from_single_dict({"a": [1]})  # type: ignore[dict-item]
    with pytest.raises(ProtocolTypeError, match=r"expected a TensorDict, got dict"):
        DataProto.from_tensordict({"a": torch.zeros(1)})  # type: ignore[arg-type]
    with pytest.raises(
        BatchSizeMismatchError, match=r"has 2 batch dimensions \[1, 2\]; a DataProto has one"
    ):
        DataProto.from_tensordict(TensorDict({"a": torch.zeros(1, 2)}, batch_size=[1, 2]))


# --- indexing ----------------------------------------------------------------------------


@pytest.mark.parametrize("index", [5, -6, 100])
def test_int_index_out_of_range(index: int) -> None:
    with pytest.raises(IndexOutOfRangeError, match=rf"index {index} is out of range for 5 rows"):
        make_dp(5)[index]


@pytest.mark.parametrize("index", [[0, 5], np.array([-6]), torch.tensor([7, 1])])
def test_index_list_out_of_range(index: Any) -> None:
    with pytest.raises(
        IndexOutOfRangeError, match=r"index (5|-6|7) is out of range for a batch of 5 rows"
    ):
        make_dp(5)[index]


def test_index_errors() -> None:
    dp = make_dp(3)
    with pytest.raises(
        BatchSizeMismatchError, match=r"boolean mask has 2 entries, the batch has 3 rows"
    ):
        dp[np.array([True, False])]
    with pytest.raises(ProtocolTypeError, match=r"must not be a bool"):
        dp[True]
    with pytest.raises(ProtocolTypeError, match=r"got str"):
        dp["ids"]  # type: ignore[index]
    with pytest.raises(
        ProtocolTypeError, match=r"indices must be integers or booleans, got dtype float64"
    ):
        dp[np.array([0.5])]
    with pytest.raises(ProtocolTypeError, match=r"the index must be 1-d, got shape \(1, 1\)"):
        dp.select_idxs(np.array([[0]]))
    with pytest.raises(
        ProtocolTypeError, match=r"expected a list, numpy array or tensor of indices"
    ):
        dp.select_idxs("0")  # type: ignore[arg-type]
    with pytest.raises(InvalidSizeError, match=r"step must not be zero"):
        dp.slice(0, 2, 0)


# --- keys --------------------------------------------------------------------------------


def test_select_missing_keys() -> None:
    dp = make_dp(2)
    with pytest.raises(
        MissingKeyError,
        match=r"batch key 'nope' not found; batch keys are \['ids', 'logp', 'mask'\]",
    ):
        dp.select(batch_keys=["nope"])
    with pytest.raises(MissingKeyError, match=r"non-tensor key 'nope' not found"):
        dp.select(non_tensor_batch_keys=["nope"])
    with pytest.raises(MissingKeyError, match=r"meta_info key 'nope' not found"):
        dp.select(meta_info_keys=["nope"])
    with pytest.raises(
        ProtocolTypeError, match=r"batch_keys must be a list of keys, got the string 'ids'"
    ):
        dp.select(batch_keys="ids")
    with pytest.raises(MissingKeyError, match=r"no tensor columns"):
        make_dp(2, tensors=False).select(batch_keys=["ids"])


def test_pop_missing_key_changes_nothing() -> None:
    dp = make_dp(2)
    with pytest.raises(MissingKeyError, match=r"batch key 'nope' not found"):
        dp.pop(batch_keys=["ids", "nope"])
    assert dp.batch is not None
    assert "ids" in set(dp.batch.keys())
    with pytest.raises(KeyError):
        dp.pop(non_tensor_batch_keys=["nope"])
    with pytest.raises(MissingKeyError, match=r"no tensor columns"):
        make_dp(2, tensors=False).pop(batch_keys=["ids"])


def test_rename_errors() -> None:
    dp = make_dp(2)
    with pytest.raises(InvalidSizeError, match=r"2 old keys \['ids', 'logp'\] but 1 new keys"):
        dp.rename(["ids", "logp"], ["x"])
    with pytest.raises(MissingKeyError, match=r"key 'nope' not found"):
        dp.rename("nope", "x")
    with pytest.raises(
        KeyConflictError, match=r"cannot rename 'ids' to 'logp': 'logp' already exists"
    ):
        dp.rename("ids", "logp")
    with pytest.raises(KeyConflictError, match=r"new keys \['x', 'x'\] contain duplicates"):
        dp.rename(["ids", "logp"], ["x", "x"])
    with pytest.raises(KeyConflictError, match=r"old keys \['ids', 'ids'\] contain duplicates"):
        dp.rename(["ids", "ids"], ["x", "y"])
    with pytest.raises(ProtocolTypeError, match=r"can only be renamed to a string"):
        dp.rename(["uid"], [("a", "b")])
    assert dp.batch is not None
    assert sorted(dp.batch.keys()) == ["ids", "logp", "mask"]


def test_union_conflicts_change_nothing() -> None:
    a = make_dp(2)
    b = make_dp(2)
    assert b.batch is not None
    b.batch["ids"] = b.batch["ids"] + 1
    b.batch["new"] = torch.zeros(2)
    with pytest.raises(
        KeyConflictError,
        match=r"key 'ids' has different values on the two sides \(shapes \(2, 3\) and \(2, 3\)\)",
    ):
        a.union(b)
    assert a.batch is not None
    assert "new" not in set(a.batch.keys())
    c = make_dp(2)
    c.non_tensor_batch["uid"] = np.array(["x", "y"], dtype=object)
    with pytest.raises(KeyConflictError, match=r"non-tensor key 'uid' has different values"):
        a.union(c)
    d = make_dp(2, meta={"step": 4})
    with pytest.raises(
        KeyConflictError, match=r"meta_info key 'step' has different values: 3 vs 4"
    ):
        a.union(d)
    with pytest.raises(BatchSizeMismatchError, match=r"this batch has 2 rows, the other has 3"):
        a.union(make_dp(3))
    with pytest.raises(ProtocolTypeError, match=r"expected a DataProto, got dict"):
        a.union({})  # type: ignore[arg-type]


def test_union_helpers_errors() -> None:
    with pytest.raises(BatchSizeMismatchError, match=r"batch sizes differ: \(2,\) vs \(3,\)"):
        union_tensor_dict(TensorDict({}, batch_size=[2]), TensorDict({}, batch_size=[3]))
    with pytest.raises(KeyConflictError, match=r"key 'a'"):
        union_tensor_dict(
            TensorDict({"a": torch.zeros(2)}, batch_size=[2]),
            TensorDict({"a": torch.ones(2)}, batch_size=[2]),
        )
    with pytest.raises(
        KeyConflictError,
        match=r"non-tensor key 'a' has different values .*shapes \(2,\) and \(3,\)",
    ):
        union_numpy_dict({"a": np.arange(2)}, {"a": np.arange(3)})


def test_concat_errors() -> None:
    with pytest.raises(InvalidSizeError, match=r"nothing to concatenate \(empty list\)"):
        DataProto.concat([])
    a = make_dp(2)
    b = make_dp(2)
    assert b.batch is not None
    b.batch["extra"] = torch.zeros(2)
    with pytest.raises(
        KeyMismatchError,
        match=r"part 1 has tensor keys \['extra', 'ids', 'logp', 'mask'\], "
        r"part 0 has \['ids', 'logp', 'mask'\]",
    ):
        DataProto.concat([a, b])
    c = make_dp(2, non_tensors=False)
    with pytest.raises(
        KeyMismatchError, match=r"part 1 has non-tensor keys \[\], part 0 has \['score', 'uid'\]"
    ):
        DataProto.concat([a, c])
    with pytest.raises(KeyMismatchError, match=r"part 1 has tensor keys None"):
        DataProto.concat([a, make_dp(2, tensors=False)])
    with pytest.raises(ProtocolTypeError, match=r"part 1 is a dict, not a DataProto"):
        DataProto.concat([a, {}])  # type: ignore[type-var]


def test_collate_errors() -> None:
    with pytest.raises(InvalidSizeError, match=r"no rows to collate"):
        collate_fn([])
    a = make_dp(1)[0]
    b = make_dp(1, tensors=False)[0]
    with pytest.raises(KeyMismatchError, match=r"some rows have tensor columns and some do not"):
        collate_fn([a, b])
    c = make_dp(1, non_tensors=False)[0]
    with pytest.raises(
        KeyMismatchError, match=r"row 1 has non-tensor keys \[\], row 0 has \['score', 'uid'\]"
    ):
        collate_fn([a, c])


# --- sizes -------------------------------------------------------------------------------


def test_chunk_errors() -> None:
    dp = make_dp(3)
    with pytest.raises(InvalidSizeError, match=r"chunks must be >= 1, got 0 \(3 rows\)"):
        dp.chunk(0)
    with pytest.raises(InvalidSizeError, match=r"3 rows do not divide evenly into 4 chunks"):
        dp.chunk(4)
    with pytest.raises(InvalidSizeError, match=r"3 rows do not divide evenly into 2 chunks"):
        dp.chunk(2)
    with pytest.raises(ProtocolTypeError, match=r"chunks must be an int, got 2.0"):
        dp.chunk(2.0)  # type: ignore[arg-type]
    DataProtoConfig.auto_padding = True
    assert len(dp.chunk(4)) == 4
    assert len(dp.chunk(24)) == 24
    with pytest.raises(InvalidSizeError, match=r"25 chunks for 3 rows is more than 8 chunks per"):
        dp.chunk(25)


@pytest.mark.parametrize("size", [0, -1, True])
def test_split_errors(size: int) -> None:
    with pytest.raises(InvalidSizeError, match=r"split_size must be a positive int"):
        make_dp(3).split(size)


def test_repeat_and_unfold_errors() -> None:
    dp = make_dp(2)
    with pytest.raises(InvalidSizeError, match=r"repeat_times must be a non-negative int, got -1"):
        dp.repeat(-1)
    with pytest.raises(BatchSizeMismatchError, match=r"3 repeat counts for 2 rows"):
        dp.sample_level_repeat([1, 1, 1])
    with pytest.raises(InvalidSizeError, match=r"repeat counts must be >= 0, got -1"):
        dp.sample_level_repeat([1, -1])
    with pytest.raises(ProtocolTypeError, match=r"repeat counts must be integers, got float64"):
        dp.sample_level_repeat(np.array([1.0, 2.0]))
    with pytest.raises(InvalidSizeError, match=r"n_split must be a positive int, got 0"):
        dp.unfold_column_chunks(0)
    with pytest.raises(MissingKeyError, match=r"split key 'nope' not found"):
        dp.unfold_column_chunks(2, ["nope"])
    with pytest.raises(
        InvalidSizeError,
        match=r"column 'ids' has 3 entries in dimension 1, not divisible by n_split=2",
    ):
        dp.unfold_column_chunks(2, ["ids"])
    with pytest.raises(
        BatchSizeMismatchError,
        match=r"column 'uid' has shape \(2,\); a split column needs a second dimension",
    ):
        dp.unfold_column_chunks(2, ["uid"])


def test_make_iterator_errors() -> None:
    dp = make_dp(6)
    with pytest.raises(
        InvalidSizeError, match=r"mini_batch_size 4 must be positive and divide the 6 rows"
    ):
        dp.make_iterator(4, 1)
    with pytest.raises(InvalidSizeError, match=r"mini_batch_size 0"):
        dp.make_iterator(0, 1)
    with pytest.raises(ProtocolTypeError, match=r"mini_batch_size must be an int"):
        dp.make_iterator(2.0, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidSizeError, match=r"epochs must be a non-negative int, got -1"):
        dp.make_iterator(2, -1)


def test_padding_errors() -> None:
    dp = make_dp(2)
    with pytest.raises(InvalidSizeError, match=r"padding_size must be a non-negative int, got -1"):
        dp.padding(-1)
    with pytest.raises(
        ProtocolTypeError, match=r"padding_candidate must be '', 'first' or 'last', got 'middle'"
    ):
        dp.padding(1, "middle")
    with pytest.raises(InvalidSizeError, match=r"cannot pad an empty batch with 2 rows"):
        DataProto().padding(2)
    with pytest.raises(InvalidSizeError, match=r"size_divisor must be a positive int, got 0"):
        pad_dataproto_to_divisor(dp, 0)
    with pytest.raises(ProtocolTypeError, match=r"expected a DataProto, got list"):
        pad_dataproto_to_divisor([1], 2)  # type: ignore[type-var]
    with pytest.raises(InvalidSizeError, match=r"cannot drop 3 padding rows from a batch of 2"):
        unpad_dataproto(dp, 3)
    with pytest.raises(InvalidSizeError, match=r"pad_size must be a non-negative int, got -1"):
        unpad_dataproto(dp, -1)


def test_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProtocolTypeError, match=r"auto_padding must be a bool .* got str 'yes'"):
        DataProtoConfig.auto_padding = "yes"  # type: ignore[assignment]
    with pytest.raises(ProtocolTypeError, match=r"copy_readonly_buffers must be a bool"):
        DataProtoConfig.copy_readonly_buffers = 1  # type: ignore[assignment]
    monkeypatch.setenv("SC_PROTOCOL_AUTO_PADDING", "maybe")
    with pytest.raises(
        SettingValueError, match=re.escape("SC_PROTOCOL_AUTO_PADDING='maybe' is not a valid bool")
    ):
        _ = DataProtoConfig.auto_padding
