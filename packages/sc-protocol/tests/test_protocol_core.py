"""DataProto's verl API: construction, indexing, selection, joining, reshaping, iteration."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from _protocol_helpers import assert_dp_equal, make_dp, row_ids
from sc_protocol import (
    DataProto,
    DataProtoConfig,
    DataProtoItem,
    InvalidSizeError,
    KeyConflictError,
    ProtocolTypeError,
    collate_fn,
    union_numpy_dict,
    union_tensor_dict,
)
from tensordict import NonTensorData, NonTensorStack, TensorDict


def test_from_dict_builds_batch_and_columns() -> None:
    dp = make_dp(4)
    assert len(dp) == 4
    assert dp.batch is not None
    assert dp.batch.batch_size == torch.Size([4])
    assert dp.non_tensor_batch["uid"].dtype == object
    assert dp.meta_info == {"step": 3}


def test_from_dict_lays_out_lists_of_lists_as_verl_does() -> None:
    # verl: np.array(value, dtype=object): rows of one length make a 2-d object column.
    dp = DataProto.from_dict(non_tensors={"ids": [[1, 2], [3, 4], [5, 6]]})
    col = dp.non_tensor_batch["ids"]
    assert col.shape == (3, 2)
    assert col.dtype == object
    assert list(col[:, 1]) == [2, 4, 6]
    assert len(dp) == 3
    assert dp.batch is None
    # unfold_column_chunks relies on the second dimension.
    unfolded = dp.unfold_column_chunks(2, split_keys=["ids"])
    assert unfolded.non_tensor_batch["ids"].tolist() == [[1], [2], [3], [4], [5], [6]]
    # The constructor takes lists by the same rule.
    assert DataProto(non_tensor_batch={"ids": [[1, 2], [3, 4]]}).non_tensor_batch["ids"].shape == (
        2,
        2,
    )


def test_from_dict_keeps_ragged_lists_and_arrays_as_one_object_per_row() -> None:
    arrays = [np.zeros((2, 2)), np.zeros((2, 3)), np.zeros(1)]  # numpy cannot stack these
    dp = DataProto.from_dict(non_tensors={"ids": [[1, 2], [3], []], "arrays": arrays})
    assert dp.non_tensor_batch["ids"].shape == (3,)
    assert dp.non_tensor_batch["ids"][0] == [1, 2]
    assert dp.non_tensor_batch["arrays"].shape == (3,)
    assert all(a is b for a, b in zip(dp.non_tensor_batch["arrays"], arrays, strict=True))


def test_from_dict_auto_padding_sets_flag() -> None:
    dp = DataProto.from_dict({"x": torch.zeros(3)}, auto_padding=True)
    assert dp.meta_info[DataProtoConfig.auto_padding_key] is True
    assert dp.is_padding_enabled()


def test_from_dict_takes_the_first_dimension_as_rows() -> None:
    dp = DataProto.from_dict({"x": torch.zeros(2, 3, 4)}, num_batch_dims=1)
    assert dp.batch is not None
    assert dp.batch.batch_size == torch.Size([2])
    assert len(dp) == 2


def test_from_single_dict_splits_by_type() -> None:
    dp = DataProto.from_single_dict({"x": torch.ones(2), "y": np.array(["a", "b"], dtype=object)})
    assert dp.batch is not None
    assert list(dp.batch.keys()) == ["x"]
    assert list(dp.non_tensor_batch) == ["y"]


def test_from_tensordict_moves_non_tensors() -> None:
    td = TensorDict({"x": torch.arange(3)}, batch_size=[3])
    td["s"] = NonTensorStack(*[NonTensorData(c) for c in "abc"])
    td.set_non_tensor("cfg", {"k": 1})
    dp = DataProto.from_tensordict(td, meta_info={"m": 2})
    assert dp.batch is not None
    assert list(dp.batch.keys()) == ["x"]
    assert list(dp.non_tensor_batch["s"]) == ["a", "b", "c"]
    assert dp.meta_info == {"m": 2, "cfg": {"k": 1}}


def test_empty_dataproto() -> None:
    dp = DataProto()
    assert len(dp) == 0
    assert dp.batch is None
    assert "rows=0" in repr(dp)


def test_getitem_int_returns_item() -> None:
    dp = make_dp(5)
    item = dp[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch is not None
    assert item.batch["ids"].tolist() == [6, 7, 8]
    assert item.non_tensor_batch["uid"] == "u2"
    assert dp[-1].non_tensor_batch["uid"] == "u4"
    assert dp[np.int64(1)].non_tensor_batch["uid"] == "u1"


def test_getitem_item_meta_is_a_copy() -> None:
    dp = make_dp(2)
    dp[0].meta_info["step"] = 99
    assert dp.meta_info["step"] == 3


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (slice(1, 4), [1, 2, 3]),
        (slice(None, None, 2), [0, 2, 4]),
        ([4, 0, 0], [4, 0, 0]),
        (np.array([3, 1]), [3, 1]),
        (torch.tensor([2, -1]), [2, 4]),
        (np.array([True, False, True, False, False]), [0, 2]),
        (torch.tensor([False, True, False, True, True]), [1, 3, 4]),
        ([], []),
    ],
)
def test_getitem_rows(index: Any, expected: list[int]) -> None:
    dp = make_dp(5)
    sub = dp[index]
    assert isinstance(sub, DataProto)
    assert row_ids(sub) == expected
    assert list(sub.non_tensor_batch["uid"]) == [f"u{i}" for i in expected]
    assert sub.meta_info == dp.meta_info
    assert sub.meta_info is not dp.meta_info


def test_slice_is_a_view() -> None:
    dp = make_dp(4)
    sub = dp.slice(1, 3)
    assert sub.batch is not None
    assert dp.batch is not None
    sub.batch["ids"][0, 0] = -1
    assert int(dp.batch["ids"][1, 0]) == -1


def test_select_shares_tensors_and_copies_when_asked() -> None:
    dp = make_dp(3, meta={"cfg": {"a": [1]}})
    sel = dp.select(batch_keys=["ids"], non_tensor_batch_keys=["uid"], meta_info_keys=["cfg"])
    assert sel.batch is not None
    assert dp.batch is not None
    assert list(sel.batch.keys()) == ["ids"]
    assert sel.batch["ids"] is dp.batch["ids"]
    assert list(sel.non_tensor_batch) == ["uid"]
    deep = dp.select(deepcopy=True)
    deep.meta_info["cfg"]["a"].append(2)
    assert dp.meta_info["cfg"] == {"a": [1]}
    everything = dp.select()
    assert_dp_equal(everything, dp)
    assert everything.batch is not dp.batch


def test_pop_removes_and_returns() -> None:
    dp = make_dp(3)
    popped = dp.pop(batch_keys=["ids"], non_tensor_batch_keys=["uid"], meta_info_keys=["step"])
    assert popped.batch is not None
    assert dp.batch is not None
    assert list(popped.batch.keys()) == ["ids"]
    assert "ids" not in set(dp.batch.keys())
    assert list(popped.non_tensor_batch) == ["uid"]
    assert "uid" not in dp.non_tensor_batch
    assert popped.meta_info == {"step": 3}
    assert "step" not in dp.meta_info
    assert len(popped) == 3


def test_rename_several_keys_and_swap() -> None:
    dp = make_dp(2)
    assert dp.batch is not None
    ids = dp.batch["ids"]
    out = dp.rename(["ids", "logp"], ["input_ids", "old_logp"])
    assert out is dp
    assert dp.batch["input_ids"] is ids
    assert "old_logp" in set(dp.batch.keys())
    dp.rename(["input_ids", "old_logp"], ["old_logp", "input_ids"])
    assert dp.batch["old_logp"] is ids
    dp.rename("uid", "request_id")
    assert "request_id" in dp.non_tensor_batch


def test_union_adds_columns() -> None:
    a = make_dp(3, non_tensors=False)
    b = DataProto.from_dict(
        {"extra": torch.ones(3)}, {"uid": ["x", "y", "z"]}, {"step": 3, "new": 1}
    )
    assert a.batch is not None
    b_ids = {"ids": a.batch["ids"].clone()}
    same = DataProto.from_dict(b_ids)
    out = a.union(b).union(same)
    assert out is a
    assert a.batch is not None
    assert "extra" in set(a.batch.keys())
    assert list(a.non_tensor_batch["uid"]) == ["x", "y", "z"]
    assert a.meta_info == {"step": 3, "new": 1}


def test_union_when_one_side_has_no_tensors() -> None:
    only_np = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    tensors = DataProto.from_dict({"x": torch.arange(2)})
    only_np.union(tensors)
    assert only_np.batch is not None
    assert only_np.batch["x"].tolist() == [0, 1]
    tensors2 = DataProto.from_dict({"x": torch.arange(2)})
    tensors2.union(DataProto.from_dict(non_tensors={"uid": ["a", "b"]}))
    assert list(tensors2.non_tensor_batch["uid"]) == ["a", "b"]


def test_union_nan_equal_is_not_a_conflict() -> None:
    a = DataProto.from_dict(
        {"x": torch.tensor([float("nan"), 1.0])}, {"f": np.array([np.nan, 2.0])}
    )
    b = DataProto.from_dict(
        {"x": torch.tensor([float("nan"), 1.0])}, {"f": np.array([np.nan, 2.0])}
    )
    a.union(b)
    assert len(a) == 2


def test_union_helpers_return_first_argument() -> None:
    td1 = TensorDict({"a": torch.ones(2)}, batch_size=[2])
    td2 = TensorDict({"b": torch.zeros(2)}, batch_size=[2])
    assert union_tensor_dict(td1, td2) is td1
    assert set(td1.keys()) == {"a", "b"}
    d1: dict[str, Any] = {"a": np.array([1, 2])}
    assert union_numpy_dict(d1, {"b": np.array(["x", "y"], dtype=object)}) is d1
    assert set(d1) == {"a", "b"}


def test_concat_joins_rows_and_meta() -> None:
    parts = make_dp(6).chunk(3)
    parts[1].meta_info["extra"] = 1
    joined = DataProto.concat(parts)
    assert row_ids(joined) == list(range(6))
    assert joined.meta_info == {"step": 3, "extra": 1}
    assert DataProto.concat([parts[0]]) is not parts[0]


def test_concat_without_tensors() -> None:
    parts = [
        DataProto.from_dict(non_tensors={"u": ["a"]}),
        DataProto.from_dict(non_tensors={"u": ["b"]}),
    ]
    assert list(DataProto.concat(parts).non_tensor_batch["u"]) == ["a", "b"]


@pytest.mark.parametrize(
    ("rows", "chunks", "sizes"), [(6, 3, [2, 2, 2]), (8, 4, [2] * 4), (5, 5, [1] * 5)]
)
def test_chunk_sizes_and_views(rows: int, chunks: int, sizes: list[int]) -> None:
    dp = make_dp(rows)
    parts = dp.chunk(chunks)
    assert [len(p) for p in parts] == sizes
    assert row_ids(DataProto.concat(parts)) == list(range(rows))
    assert parts[0].batch is not None
    assert dp.batch is not None
    assert parts[0].batch["ids"].data_ptr() == dp.batch["ids"].data_ptr()


@pytest.mark.parametrize(("rows", "chunks"), [(7, 3), (5, 2), (3, 4), (1, 2)])
def test_chunk_is_exact_without_padding(rows: int, chunks: int) -> None:
    with pytest.raises(InvalidSizeError, match=rf"{rows} rows do not divide evenly into {chunks}"):
        make_dp(rows).chunk(chunks)


def test_chunk_with_padding_allows_uneven_parts() -> None:
    dp = make_dp(7, meta={DataProtoConfig.auto_padding_key: True})
    assert [len(p) for p in dp.chunk(3)] == [3, 2, 2]


def test_chunk_with_padding_enabled_returns_exactly_n_parts() -> None:
    dp = make_dp(3, meta={DataProtoConfig.auto_padding_key: True})
    parts = dp.chunk(5)
    assert len(parts) == 5
    assert [len(p) for p in parts] == [1, 1, 1, 0, 0]


def test_split() -> None:
    dp = make_dp(7)
    parts = dp.split(3)
    assert [len(p) for p in parts] == [3, 3, 1]
    assert row_ids(parts[2]) == [6]
    assert DataProto().split(2) == []


@pytest.mark.parametrize("kind", ["list", "numpy", "tensor"])
def test_reorder_accepts_every_index_type(kind: str) -> None:
    dp = make_dp(4)
    order = [3, 1, 0, 2]
    index: Any = {"list": order, "numpy": np.array(order), "tensor": torch.tensor(order)}[kind]
    dp.reorder(index)
    assert row_ids(dp) == order
    assert list(dp.non_tensor_batch["uid"]) == [f"u{i}" for i in order]


def test_repeat_interleave_and_tile() -> None:
    dp = make_dp(3)
    assert row_ids(dp.repeat(2)) == [0, 0, 1, 1, 2, 2]
    tiled = dp.repeat(2, interleave=False)
    assert row_ids(tiled) == [0, 1, 2, 0, 1, 2]
    assert list(tiled.non_tensor_batch["uid"]) == ["u0", "u1", "u2"] * 2
    assert len(dp.repeat(0)) == 0


@pytest.mark.parametrize(
    "counts", [[2, 0, 1], (2, 0, 1), np.array([2, 0, 1]), torch.tensor([2, 0, 1])]
)
def test_sample_level_repeat(counts: Any) -> None:
    dp = make_dp(3)
    out = dp.sample_level_repeat(counts)
    assert row_ids(out) == [0, 0, 2]
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u0", "u2"]
    assert row_ids(dp.sample_level_repeat(2)) == [0, 0, 1, 1, 2, 2]


def test_unfold_column_chunks_with_non_tensor_columns() -> None:
    dp = DataProto.from_dict(
        {"x": torch.arange(8).reshape(2, 4), "y": torch.tensor([10, 20])},
        {"pairs": np.arange(8).reshape(2, 4), "uid": ["a", "b"]},
    )
    out = dp.unfold_column_chunks(2, split_keys=["x", "pairs"])
    assert out.batch is not None
    assert out.batch["x"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out.batch["y"].tolist() == [10, 10, 20, 20]
    assert out.non_tensor_batch["pairs"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert list(out.non_tensor_batch["uid"]) == ["a", "a", "b", "b"]
    plain = dp.unfold_column_chunks(2)
    assert plain.batch is not None
    assert plain.batch["x"].shape == (4, 4)


def test_to_device_in_place() -> None:
    dp = make_dp(2)
    assert dp.to("cpu") is dp
    assert dp.batch is not None
    assert dp.batch["ids"].device.type == "cpu"
    assert DataProto().to("cpu").batch is None


def test_make_iterator_epochs_and_seed() -> None:
    dp = make_dp(8)
    batches = list(dp.make_iterator(mini_batch_size=4, epochs=2))
    assert [row_ids(b) for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2
    assert all(b.meta_info == {"step": 3} for b in batches)
    a = [row_ids(b) for b in dp.make_iterator(4, 1, seed=7, dataloader_kwargs={"shuffle": True})]
    b = [row_ids(b) for b in dp.make_iterator(4, 1, seed=7, dataloader_kwargs={"shuffle": True})]
    assert a == b
    assert sorted(a[0] + a[1]) == list(range(8))
    assert list(batches[0].non_tensor_batch["uid"]) == ["u0", "u1", "u2", "u3"]


def test_collate_fn_stacks_items() -> None:
    dp = make_dp(3)
    out = collate_fn([dp[i] for i in range(3)])
    assert_dp_equal(out, dp)
    lists = DataProto.from_dict(non_tensors={"l": [[1], [2, 3]]})
    stacked = collate_fn([lists[0], lists[1]])
    assert stacked.non_tensor_batch["l"][1] == [2, 3]


def test_get_data_info_and_print_size(caplog: pytest.LogCaptureFixture) -> None:
    dp = make_dp(4)
    info = dp.get_data_info()
    assert "'ids': shape=(4, 3), dtype=torch.int64" in info
    assert "'uid': shape=(4,), dtype=object" in info
    with caplog.at_level(logging.INFO, logger="sc_protocol"):
        text = dp.print_size(prefix="actor: ")
    assert text.startswith("actor: size of tensordict:")
    assert text in caplog.text


def test_nested_tensordict_columns() -> None:
    td = TensorDict({"a": torch.arange(4), "n": {"b": torch.arange(4) * 2}}, batch_size=[4])
    dp = DataProto(batch=td, non_tensor_batch={"u": np.arange(4)})
    parts = dp.chunk(2)
    joined = DataProto.concat(parts)
    assert joined.batch is not None
    assert joined.batch["n", "b"].tolist() == [0, 2, 4, 6]
    sel = dp.select(batch_keys=[("n", "b")])
    assert sel.batch is not None
    assert sel.batch["n", "b"].tolist() == [0, 2, 4, 6]


# --- verl's meta_info rules in concat ------------------------------------------------------


def test_concat_meta_info_conflict_names_the_key_and_both_values() -> None:
    a = make_dp(2, meta={"temperature": 1.0, "step": 3})
    b = make_dp(2, meta={"temperature": 0.7, "step": 3})
    with pytest.raises(
        KeyConflictError, match=r"'temperature' differs.*1\.0 \(part 0\) vs 0\.7"
    ) as info:
        DataProto.concat([a, b])
    assert isinstance(info.value, ValueError)
    same = DataProto.concat([a, make_dp(2, meta={"temperature": 1.0, "extra": "x"})])
    assert same.meta_info == {"temperature": 1.0, "step": 3, "extra": "x"}


def test_concat_gathers_metrics_into_one_dict_of_lists() -> None:
    parts = [
        make_dp(1, meta={"metrics": {"loss": 1.0, "kl": 0.1}}),
        make_dp(1, meta={"metrics": [{"loss": 2.0, "kl": 0.2}, {"loss": 3.0}]}),
        make_dp(1, meta={"metrics": {"loss": 4.0}}),
    ]
    out = DataProto.concat(parts)
    assert out.meta_info["metrics"] == {"loss": [1.0, 2.0, 3.0, 4.0], "kl": [0.1, 0.2]}
    with pytest.raises(ProtocolTypeError, match=r"metrics.*must be a dict or a list of dicts"):
        DataProto.concat([make_dp(1, meta={"metrics": 5})])


# --- to_tensordict / from_tensordict -------------------------------------------------------


def test_to_tensordict_round_trips_columns_and_meta_info() -> None:
    dp = DataProto.from_dict(
        tensors={"ids": torch.arange(6).reshape(3, 2), "mask": torch.ones(3, 2)},
        non_tensors={
            "text": ["a", "bb", "ccc"],
            "extra": [{"k": 1}, [1, 2], None],
            "score": np.array([0.5, 1.5, 2.5]),
            "label": np.array(["x", "y", "z"]),
        },
        meta_info={"temperature": 0.7, "cfg": {"lr": 1e-3}},
    )
    td = dp.to_tensordict()
    assert td.batch_size == torch.Size([3])
    assert dp.batch is not None
    assert td["ids"].data_ptr() == dp.batch["ids"].data_ptr()  # shared, not copied
    back = DataProto.from_tensordict(td)
    assert_dp_equal(back, dp)
    assert back.non_tensor_batch["score"].dtype == np.float64
    assert back.non_tensor_batch["label"].dtype.kind == "U"
    assert back.meta_info == {"temperature": 0.7, "cfg": {"lr": 1e-3}}


def test_to_tensordict_without_tensors_and_name_clashes() -> None:
    dp = DataProto.from_dict(non_tensors={"text": ["a", "b"]}, meta_info={"m": 1})
    back = DataProto.from_tensordict(dp.to_tensordict())
    assert back.batch is None
    assert list(back.non_tensor_batch["text"]) == ["a", "b"]
    assert back.meta_info == {"m": 1}
    clash = DataProto.from_dict(tensors={"x": torch.zeros(2)}, meta_info={"x": 1})
    with pytest.raises(KeyConflictError, match=r"meta_info key 'x' is also a column name"):
        clash.to_tensordict()
