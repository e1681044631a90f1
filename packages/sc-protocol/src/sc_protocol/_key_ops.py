"""The key-level operations of :class:`~sc_protocol.DataProto`: select, pop, rename, union
and concat (functions; the DataProto methods of the same names call them)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from tensordict import TensorDict, TensorDictBase

from ._columns import Key, NDArray, _has_key, _key_str, cat_tensordicts
from ._errors import (
    BatchSizeMismatchError,
    InvalidSizeError,
    KeyConflictError,
    KeyMismatchError,
    MissingKeyError,
    ProtocolTypeError,
)
from ._union import (
    _concat_meta,
    _union_meta,
    check_concat_columns,
    union_numpy_dict,
    union_tensor_dict,
)

if TYPE_CHECKING:
    from ._data_proto import DataProto

__all__ = ["concat", "pop", "rename", "select", "union"]

D = TypeVar("D", bound="DataProto")


def select(
    data: D,
    batch_keys: Sequence[Key] | None = None,
    non_tensor_batch_keys: Sequence[str] | None = None,
    meta_info_keys: Sequence[str] | None = None,
    deepcopy: bool = False,
) -> D:
    data._require_keys("select", batch_keys, non_tensor_batch_keys, meta_info_keys)
    batch = data.batch
    if batch is not None:
        batch = batch.clone(False) if batch_keys is None else batch.select(*batch_keys)
    elif batch_keys:
        raise MissingKeyError(
            f"DataProto.select: batch keys {list(batch_keys)} requested, but the batch has "
            "no tensor columns"
        )
    if non_tensor_batch_keys is None:
        non_tensor = dict(data.non_tensor_batch)
    else:
        non_tensor = {k: data.non_tensor_batch[k] for k in non_tensor_batch_keys}
    if meta_info_keys is None:
        meta = dict(data.meta_info)
    else:
        meta = {k: data.meta_info[k] for k in meta_info_keys}
    if deepcopy:
        non_tensor = copy.deepcopy(non_tensor)
        meta = copy.deepcopy(meta)
    obj = data._new(batch, non_tensor)
    obj.meta_info = meta
    return obj


def _require_keys(
    data: DataProto,
    what: str,
    batch_keys: Sequence[Key] | None,
    non_tensor_batch_keys: Sequence[str] | None,
    meta_info_keys: Sequence[str] | None,
) -> None:
    for name, keys in (
        ("batch_keys", batch_keys),
        ("non_tensor_batch_keys", non_tensor_batch_keys),
        ("meta_info_keys", meta_info_keys),
    ):
        if isinstance(keys, str):
            raise ProtocolTypeError(
                f"DataProto.{what}: {name} must be a list of keys, got the string {keys!r}"
            )
    if batch_keys and data.batch is not None:
        available = [_key_str(k) for k in data.batch.keys(include_nested=True)]
        for key in batch_keys:
            if not _has_key(data.batch, key):
                raise MissingKeyError(
                    f"DataProto.{what}: batch key {_key_str(key)} not found; "
                    f"batch keys are [{', '.join(available)}]"
                )
    for key in non_tensor_batch_keys or ():
        if key not in data.non_tensor_batch:
            raise MissingKeyError(
                f"DataProto.{what}: non-tensor key {key!r} not found; "
                f"non-tensor keys are {sorted(data.non_tensor_batch)}"
            )
    for key in meta_info_keys or ():
        if key not in data.meta_info:
            raise MissingKeyError(
                f"DataProto.{what}: meta_info key {key!r} not found; "
                f"meta_info keys are {sorted(data.meta_info)}"
            )


def pop(
    data: D,
    batch_keys: Sequence[Key] | None = None,
    non_tensor_batch_keys: Sequence[str] | None = None,
    meta_info_keys: Sequence[str] | None = None,
) -> D:
    batch_keys = list(batch_keys or [])
    non_tensor_batch_keys = list(non_tensor_batch_keys or [])
    meta_info_keys = list(meta_info_keys or [])
    if batch_keys and data.batch is None:
        raise MissingKeyError(
            f"DataProto.pop: batch keys {batch_keys} requested, but the batch has no tensor columns"
        )
    data._require_keys("pop", batch_keys, non_tensor_batch_keys, meta_info_keys)
    batch = None
    if batch_keys and data.batch is not None:
        popped = {key: data.batch.pop(key) for key in batch_keys}
        batch = TensorDict(popped, batch_size=data.batch.batch_size, device=data.batch.device)
    non_tensor = {k: data.non_tensor_batch.pop(k) for k in non_tensor_batch_keys}
    meta = {k: data.meta_info.pop(k) for k in meta_info_keys}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)


def rename(
    data: D,
    old_keys: Key | Sequence[Key] | None = None,
    new_keys: Key | Sequence[Key] | None = None,
) -> D:
    olds: list[Key] = [old_keys] if isinstance(old_keys, (str, tuple)) else list(old_keys or [])
    news: list[Key] = [new_keys] if isinstance(new_keys, (str, tuple)) else list(new_keys or [])
    if len(olds) != len(news):
        raise InvalidSizeError(
            f"DataProto.rename: {len(olds)} old keys {olds} but {len(news)} new keys {news}"
        )
    if len(set(news)) != len(news):
        raise KeyConflictError(f"DataProto.rename: new keys {news} contain duplicates")
    if len(set(olds)) != len(olds):
        raise KeyConflictError(f"DataProto.rename: old keys {olds} contain duplicates")
    in_batch: list[bool] = []
    for old in olds:
        if data.batch is not None and _has_key(data.batch, old):
            in_batch.append(True)
        elif isinstance(old, str) and old in data.non_tensor_batch:
            in_batch.append(False)
        else:
            raise MissingKeyError(f"DataProto.rename: key {_key_str(old)} not found")
    for old, new, tensor in zip(olds, news, in_batch, strict=True):
        taken = (data.batch is not None and _has_key(data.batch, new)) or (
            isinstance(new, str) and new in data.non_tensor_batch
        )
        if taken and new not in olds:
            raise KeyConflictError(
                f"DataProto.rename: cannot rename {_key_str(old)} to {_key_str(new)}: "
                f"{_key_str(new)} already exists"
            )
        if not tensor and not isinstance(new, str):
            raise ProtocolTypeError(
                f"DataProto.rename: non-tensor key {_key_str(old)} can only be renamed to a "
                f"string, got {new!r}"
            )
    values: list[Any] = []
    for old, tensor in zip(olds, in_batch, strict=True):
        if tensor and data.batch is not None:
            values.append(data.batch.pop(old))
        else:
            values.append(data.non_tensor_batch.pop(str(old)))
    for new, tensor, value in zip(news, in_batch, values, strict=True):
        if tensor and data.batch is not None:
            data.batch.set(new, value)
        else:
            data.non_tensor_batch[str(new)] = value
    return data


def union(data: D, other: DataProto) -> D:
    from ._data_proto import DataProto

    if not isinstance(other, DataProto):
        raise ProtocolTypeError(
            f"DataProto.union: expected a DataProto, got {type(other).__name__}"
        )
    mine_cols = data.batch is not None or bool(data.non_tensor_batch)
    other_cols = other.batch is not None or bool(other.non_tensor_batch)
    if mine_cols and other_cols and len(data) != len(other):
        raise BatchSizeMismatchError(
            f"DataProto.union: this batch has {len(data)} rows, the other has {len(other)}"
        )
    # Validate everything first, then change.
    probe: TensorDictBase | None = None
    if data.batch is not None and other.batch is not None:
        probe = data.batch.clone(False)
        union_tensor_dict(probe, other.batch)
    union_numpy_dict(dict(data.non_tensor_batch), other.non_tensor_batch)
    _union_meta(dict(data.meta_info), other.meta_info, "DataProto.union")
    if data.batch is None:
        data.batch = None if other.batch is None else other.batch.clone(False)
    elif other.batch is not None:
        data.batch = probe
    union_numpy_dict(data.non_tensor_batch, other.non_tensor_batch)
    _union_meta(data.meta_info, other.meta_info, "DataProto.union")
    return data


def concat(data: Sequence[D]) -> D:
    parts = list(data)
    if not parts:
        raise InvalidSizeError("DataProto.concat: nothing to concatenate (empty list)")
    from ._data_proto import DataProto

    first = parts[0]
    for i, part in enumerate(parts):
        if not isinstance(part, DataProto):
            raise ProtocolTypeError(
                f"DataProto.concat: part {i} is a {type(part).__name__}, not a DataProto"
            )
    first_keys = None if first.batch is None else set(first.batch.keys(include_nested=True))
    first_nt = set(first.non_tensor_batch)
    for i, part in enumerate(parts[1:], start=1):
        keys = None if part.batch is None else set(part.batch.keys(include_nested=True))
        if keys != first_keys:
            raise KeyMismatchError(
                f"DataProto.concat: part {i} has tensor keys "
                f"{None if keys is None else sorted(map(str, keys))}, part 0 has "
                f"{None if first_keys is None else sorted(map(str, first_keys))}"
            )
        if set(part.non_tensor_batch) != first_nt:
            raise KeyMismatchError(
                f"DataProto.concat: part {i} has non-tensor keys "
                f"{sorted(part.non_tensor_batch)}, part 0 has {sorted(first_nt)}"
            )
    check_concat_columns(parts)
    batch: TensorDictBase | None = None
    if first.batch is not None:
        batches = [p.batch for p in parts if p.batch is not None]
        batch = batches[0] if len(batches) == 1 else cat_tensordicts(batches)
    non_tensor: dict[str, NDArray] = {}
    for key in first.non_tensor_batch:
        columns = [p.non_tensor_batch[key] for p in parts]
        non_tensor[key] = columns[0] if len(columns) == 1 else np.concatenate(columns, axis=0)
    obj = first._new(batch, non_tensor)
    obj.meta_info = _concat_meta([p.meta_info for p in parts])
    return obj
