"""How batches become one, over plain columns (a batch TensorDict or ``None``, a dict of
numpy columns, ``meta_info``): the union of two batches' columns, the row-wise join of
several, and the ``meta_info`` rules of both (equal values, ``metrics`` gathered into lists)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from tensordict import TensorDictBase

from ._columns import Key, NDArray, _describe, _has_key, _key_str, _leaves, cat_tensordicts
from ._equality import _arrays_equal, _tensors_equal, _values_equal
from ._errors import BatchSizeMismatchError, KeyConflictError, KeyMismatchError, ProtocolTypeError

__all__ = [
    "METRICS_KEY",
    "check_concat_columns",
    "concat_columns",
    "union_columns",
    "union_numpy_dict",
    "union_tensor_dict",
]

_Batches = Sequence[TensorDictBase]

#: The ``meta_info`` key whose values concat gathers from every part (verl's rule).
METRICS_KEY = "metrics"


def union_tensor_dict(tensor_dict1: TensorDictBase, tensor_dict2: TensorDictBase) -> TensorDictBase:
    """Add the keys of ``tensor_dict2`` to ``tensor_dict1`` (in place) and return it.

    Both must have the same batch size; a key present in both must hold equal tensors
    (NaN equals NaN). Nothing is changed when an error is raised.
    """
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise BatchSizeMismatchError(
            f"union_tensor_dict: batch sizes differ: {tuple(tensor_dict1.batch_size)} vs "
            f"{tuple(tensor_dict2.batch_size)}"
        )
    new: list[tuple[Key, Any]] = []
    for key, value in _leaves(tensor_dict2):
        if _has_key(tensor_dict1, key):
            mine = tensor_dict1.get(key)
            same = (
                _tensors_equal(mine, value)
                if isinstance(mine, torch.Tensor) and isinstance(value, torch.Tensor)
                else _values_equal(mine, value)
            )
            if not same:
                both_tensors = isinstance(mine, torch.Tensor) and isinstance(value, torch.Tensor)
                if both_tensors and mine.dtype != value.dtype:
                    detail = f"dtypes {mine.dtype} and {value.dtype}"
                else:
                    detail = f"shapes {tuple(mine.shape)} and {tuple(value.shape)}"
                raise KeyConflictError(
                    f"union_tensor_dict: key {_key_str(key)} has different values on the two "
                    f"sides ({detail})"
                )
        else:
            new.append((key, value))
    for key, value in new:
        tensor_dict1.set(key, value)
    return tensor_dict1


def union_numpy_dict(
    tensor_dict1: dict[str, NDArray], tensor_dict2: dict[str, NDArray]
) -> dict[str, NDArray]:
    """Add the columns of ``tensor_dict2`` to ``tensor_dict1`` (in place) and return it.

    A key present in both must hold equal arrays (compared element by element, NaN equal to
    NaN); nothing is changed when an error is raised.
    """
    for key, value in tensor_dict2.items():
        if key in tensor_dict1:
            mine = tensor_dict1[key]
            if not _arrays_equal(mine, value):
                detail = (
                    f"dtypes {mine.dtype} and {value.dtype}"
                    if mine.dtype != value.dtype
                    else f"shapes {mine.shape} and {value.shape}"
                    if mine.shape != value.shape
                    else f"shape {mine.shape}, values differ"
                )
                raise KeyConflictError(
                    f"union_numpy_dict: non-tensor key {key!r} has different values on the two "
                    f"sides ({detail})"
                )
    for key, value in tensor_dict2.items():
        if key not in tensor_dict1:
            tensor_dict1[key] = value
    return tensor_dict1


def _union_meta(meta1: dict[str, Any], meta2: Mapping[str, Any], what: str) -> None:
    for key, value in meta2.items():
        if key in meta1 and not _values_equal(meta1[key], value):
            raise KeyConflictError(
                f"{what}: meta_info key {key!r} has different values: {meta1[key]!r} vs {value!r}"
            )
    for key, value in meta2.items():
        meta1.setdefault(key, value)


def _gather_metrics(values: Sequence[Any]) -> dict[str, list[Any]]:
    """verl's rule for ``meta_info["metrics"]`` across parts: every part contributes a dict
    or a list of dicts; the result maps each metric to the list of its values, in order."""
    dicts: list[Mapping[str, Any]] = []
    for value in values:
        if value is None:
            continue
        items = value if isinstance(value, list) else [value]
        for item in items:
            if not isinstance(item, Mapping):
                raise ProtocolTypeError(
                    f"DataProto.concat: meta_info[{METRICS_KEY!r}] must be a dict or a list of "
                    f"dicts, got a {type(item).__name__} {item!r}"
                )
            dicts.append(item)
    out: dict[str, list[Any]] = {}
    for item in dicts:
        for key, metric in item.items():
            out.setdefault(key, []).append(metric)
    return out


def _concat_meta(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    owner: dict[str, int] = {}
    for i, meta in enumerate(metas):
        for key, value in meta.items():
            if key == METRICS_KEY:
                continue
            if key not in merged:
                merged[key], owner[key] = value, i
            elif not _values_equal(merged[key], value):
                raise KeyConflictError(
                    f"DataProto.concat: meta_info key {key!r} differs between parts: "
                    f"{_describe(merged[key])} (part {owner[key]}) vs {_describe(value)} "
                    f"(part {i})"
                )
    if any(METRICS_KEY in meta for meta in metas):
        merged[METRICS_KEY] = _gather_metrics([m[METRICS_KEY] for m in metas if METRICS_KEY in m])
    return merged


def _same_kind(a: np.dtype[Any], b: np.dtype[Any]) -> bool:
    """Whether numpy can join columns of these dtypes without changing a value: the same
    dtype, or strings of different lengths (which only widen)."""
    return a == b or (a.kind == b.kind and a.kind in "US")


def check_concat_columns(
    batches: Sequence[TensorDictBase | None], non_tensors: Sequence[Mapping[str, NDArray]]
) -> None:
    """Before ``DataProto.concat`` joins the parts' ``batches`` and ``non_tensors`` (same
    keys, checked already): every key must have one dtype and the same shape after the row
    dimension in every part, so that joining neither promotes values (``float32`` with
    ``int64`` would round) nor fails half-way. Raises :class:`~sc_protocol.KeyMismatchError`
    naming the key and both."""
    first = batches[0]
    if first is not None:
        ref = {k: v for k, v in _leaves(first) if isinstance(v, torch.Tensor)}
        for i, part in enumerate(batches[1:], start=1):
            if part is None:
                continue
            for key, value in _leaves(part):
                mine = ref.get(key)
                if mine is None or not isinstance(value, torch.Tensor):
                    continue
                if value.dtype != mine.dtype:
                    raise KeyMismatchError(
                        f"DataProto.concat: tensor {_key_str(key)} is {mine.dtype} in part 0 "
                        f"and {value.dtype} in part {i}; cast one side first"
                    )
                strided = not mine.is_nested and not value.is_nested
                if strided and tuple(value.shape[1:]) != tuple(mine.shape[1:]):
                    raise KeyMismatchError(
                        f"DataProto.concat: tensor {_key_str(key)} has rows of shape "
                        f"{tuple(mine.shape[1:])} in part 0 and {tuple(value.shape[1:])} in "
                        f"part {i}; pad or trim them to one shape first"
                    )
    for key, column in non_tensors[0].items():
        for i, part_columns in enumerate(non_tensors[1:], start=1):
            other = part_columns[key]
            if not _same_kind(column.dtype, other.dtype):
                raise KeyMismatchError(
                    f"DataProto.concat: non-tensor column {key!r} is {column.dtype} in part 0 "
                    f"and {other.dtype} in part {i}; convert one side first"
                )
            if column.shape[1:] != other.shape[1:]:
                raise KeyMismatchError(
                    f"DataProto.concat: non-tensor column {key!r} has rows of shape "
                    f"{column.shape[1:]} in part 0 and {other.shape[1:]} in part {i}"
                )


def concat_columns(
    batches: Sequence[TensorDictBase | None], non_tensors: Sequence[Mapping[str, NDArray]]
) -> tuple[TensorDictBase | None, dict[str, NDArray]]:
    """``DataProto.concat``'s columns: the parts' ``batches`` and ``non_tensors`` joined row
    by row, after checking that every part has the same keys (a
    :class:`~sc_protocol.KeyMismatchError` naming the part) and :func:`check_concat_columns`.
    One part is returned as it is."""
    first = batches[0]
    first_keys = None if first is None else set(first.keys(include_nested=True))
    first_nt = set(non_tensors[0])
    for i, (part, columns) in enumerate(zip(batches[1:], non_tensors[1:], strict=True), start=1):
        keys = None if part is None else set(part.keys(include_nested=True))
        if keys != first_keys:
            raise KeyMismatchError(
                f"DataProto.concat: part {i} has tensor keys "
                f"{None if keys is None else sorted(map(str, keys))}, part 0 has "
                f"{None if first_keys is None else sorted(map(str, first_keys))}"
            )
        if set(columns) != first_nt:
            raise KeyMismatchError(
                f"DataProto.concat: part {i} has non-tensor keys "
                f"{sorted(columns)}, part 0 has {sorted(first_nt)}"
            )
    check_concat_columns(batches, non_tensors)
    batch: TensorDictBase | None = None
    if first is not None:  # then every part has tensor columns (the keys agree)
        batch = first if len(batches) == 1 else cat_tensordicts(cast(_Batches, batches))
    joined: dict[str, NDArray] = {}
    for key in non_tensors[0]:
        parts = [columns[key] for columns in non_tensors]
        joined[key] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    return batch, joined


def union_columns(
    mine: tuple[TensorDictBase | None, dict[str, NDArray], dict[str, Any], int],
    other: tuple[TensorDictBase | None, dict[str, NDArray], Mapping[str, Any], int],
) -> TensorDictBase | None:
    """``DataProto.union``'s columns: each side is its tensor batch (or ``None``), numpy
    columns, ``meta_info`` and row count. The other side's numpy columns and ``meta_info``
    are added to this side's (in place), and the joined tensor batch is returned (this
    side's batch object is not changed). Everything is checked before anything changes."""
    batch, non_tensor, meta, rows = mine
    other_batch, other_non_tensor, other_meta, other_rows = other
    mine_cols = batch is not None or bool(non_tensor)
    other_cols = other_batch is not None or bool(other_non_tensor)
    if mine_cols and other_cols and rows != other_rows:
        raise BatchSizeMismatchError(
            f"DataProto.union: this batch has {rows} rows, the other has {other_rows}"
        )
    probe: TensorDictBase | None = None
    if batch is not None and other_batch is not None:
        probe = batch.clone(False)
        union_tensor_dict(probe, other_batch)
    union_numpy_dict(dict(non_tensor), other_non_tensor)
    _union_meta(dict(meta), other_meta, "DataProto.union")
    if batch is None:
        batch = None if other_batch is None else other_batch.clone(False)
    elif other_batch is not None:
        batch = probe
    union_numpy_dict(non_tensor, other_non_tensor)
    _union_meta(meta, other_meta, "DataProto.union")
    return batch
