"""DataProto: a batch of rows made of tensor columns, numpy columns and batch-level metadata."""

from __future__ import annotations

import copy
import logging
import math
import os
import pickle
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast, overload

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from ._config import DataProtoConfig
from ._errors import (
    BatchSizeMismatchError,
    IndexOutOfRangeError,
    InvalidSizeError,
    KeyConflictError,
    KeyMismatchError,
    MissingKeyError,
    ProtocolTypeError,
    SerializationError,
)
from ._serialize import rebuild_tensordict, tensordict_state

__all__ = [
    "DataProto",
    "DataProtoItem",
    "IndexLike",
    "collate_fn",
    "pad_dataproto_to_divisor",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]

logger = logging.getLogger("sc_protocol")

D = TypeVar("D", bound="DataProto")
NDArray = np.ndarray[Any, Any]
Key = str | tuple[str, ...]
#: What selects rows: a slice, a sequence / numpy array / tensor of indices, or a boolean mask.
IndexLike = slice | Sequence[int] | Sequence[bool] | NDArray | torch.Tensor

_SAVE_FORMAT = "sc_protocol.DataProto"
#: With padding enabled, ``chunk`` may return empty parts, but not more than this many
#: parts per row (``chunk(10**6)`` of a few rows would build a million objects).
_MAX_CHUNKS_PER_ROW = 8
#: The ``meta_info`` key whose values concat gathers from every part (verl's rule).
METRICS_KEY = "metrics"
_SAVE_VERSION = 1


# --- small helpers ---------------------------------------------------------------------------


def cat_tensordicts(parts: Sequence[TensorDictBase]) -> TensorDictBase:
    """``torch.cat`` of TensorDicts along dimension 0 (typed)."""
    out: TensorDictBase = cast(Any, torch.cat)(list(parts), dim=0)
    return out


def _stack_td(parts: Sequence[TensorDictBase]) -> TensorDictBase:
    out: TensorDictBase = cast(Any, torch.stack)(list(parts), dim=0)
    return out


def _key_str(key: Key) -> str:
    return repr(key) if isinstance(key, str) else repr(tuple(key))


def _object_column(values: Iterable[Any]) -> NDArray:
    """A 1-d object array holding ``values`` as they are (lists stay lists, never a 2-d array)."""
    items = list(values)
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def _as_column(key: str, value: Any) -> NDArray:
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            raise ProtocolTypeError(
                f"non-tensor column {key!r} is a 0-d numpy array; a column needs one entry per row"
            )
        return value
    if isinstance(value, (list, tuple)):
        return _object_column(value)
    raise ProtocolTypeError(
        f"non-tensor column {key!r} must be a numpy array (or a list), got {type(value).__name__}"
    )


def _tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype or a.layout != b.layout:
        return False
    if a.is_nested or b.is_nested:
        if a.is_nested and b.is_nested:
            na: Any = a
            nb: Any = b
            return _tensors_equal(na.values(), nb.values()) and _tensors_equal(
                na.offsets(), nb.offsets()
            )
        return False
    if a.device != b.device:
        b = b.to(a.device)
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a.isnan(), b.isnan())) and bool(
            torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
        )
    return bool(torch.equal(a, b))


def _values_equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        return _arrays_equal(a, b)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return _tensors_equal(a, b)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _arrays_equal(a: NDArray, b: NDArray) -> bool:
    if a is b:
        return True
    if a.shape != b.shape:
        return False
    if a.dtype != object and b.dtype != object:
        equal_nan = a.dtype.kind in "fc" and b.dtype.kind in "fc"
        return bool(np.array_equal(a, b, equal_nan=equal_nan))
    return all(_values_equal(x, y) for x, y in zip(a.ravel(), b.ravel(), strict=True))


def _tensor_nbytes(t: torch.Tensor) -> int:
    if t.is_nested:
        try:
            return int(t.values().numel() * t.element_size())
        except RuntimeError:
            return 0
    return int(t.numel() * t.element_size())


def _leaves(td: TensorDictBase) -> list[tuple[Key, Any]]:
    return list(td.items(include_nested=True, leaves_only=True))


def _has_key(td: TensorDictBase, key: Key) -> bool:
    return key in td.keys(include_nested=True)


def _index_arrays(index: Any, length: int, what: str) -> tuple[NDArray, torch.Tensor]:
    """Normalize an index list / array / tensor / mask to int64 positions, validated."""
    if isinstance(index, torch.Tensor):
        arr = index.detach().cpu().numpy()
    elif isinstance(index, np.ndarray):
        arr = index
    elif isinstance(index, (list, tuple, range)):
        arr = np.asarray(index)
        if arr.size == 0:
            arr = arr.astype(np.int64)
    else:
        raise ProtocolTypeError(
            f"{what}: expected a list, numpy array or tensor of indices, or a boolean mask, "
            f"got {type(index).__name__}"
        )
    if arr.ndim != 1:
        raise ProtocolTypeError(f"{what}: the index must be 1-d, got shape {tuple(arr.shape)}")
    if arr.dtype == np.bool_:
        if arr.shape[0] != length:
            raise BatchSizeMismatchError(
                f"{what}: boolean mask has {arr.shape[0]} entries, the batch has {length} rows"
            )
        positions = np.flatnonzero(arr).astype(np.int64)
    elif np.issubdtype(arr.dtype, np.integer):
        positions = arr.astype(np.int64, copy=True)
        if positions.size:
            low, high = int(positions.min()), int(positions.max())
            if low < -length or high >= length:
                bad = low if low < -length else high
                raise IndexOutOfRangeError(
                    f"{what}: index {bad} is out of range for a batch of {length} rows"
                )
            positions[positions < 0] += length
    else:
        raise ProtocolTypeError(
            f"{what}: indices must be integers or booleans, got dtype {arr.dtype}"
        )
    return positions, torch.from_numpy(positions)


# --- union helpers ---------------------------------------------------------------------------


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
                raise KeyConflictError(
                    f"union_tensor_dict: key {_key_str(key)} has different values on the two "
                    f"sides (shapes {tuple(mine.shape)} and {tuple(value.shape)})"
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
                raise KeyConflictError(
                    f"union_numpy_dict: non-tensor key {key!r} has different values on the two "
                    f"sides (shapes {mine.shape} and {value.shape})"
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


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- DataProtoItem and collate -----------------------------------------------------------------


@dataclass
class DataProtoItem:
    """One row of a DataProto: ``batch`` has an empty batch size, columns hold one entry."""

    batch: TensorDictBase | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


def _stack_values(key: str, values: list[Any]) -> NDArray:
    if values and all(isinstance(v, np.ndarray) for v in values):
        shapes = {v.shape for v in values}
        if len(shapes) == 1:
            return np.stack(values)
    if values and all(isinstance(v, np.generic) for v in values):
        return np.array(values)
    return _object_column(values)


def collate_fn(x: Sequence[DataProtoItem]) -> DataProto:
    """Stack rows (``DataProtoItem``) into one DataProto (a DataLoader ``collate_fn``)."""
    items = list(x)
    if not items:
        raise InvalidSizeError("collate_fn: no rows to collate")
    batches = [item.batch for item in items]
    batch: TensorDictBase | None
    if all(b is None for b in batches):
        batch = None
    elif any(b is None for b in batches):
        raise KeyMismatchError("collate_fn: some rows have tensor columns and some do not")
    else:
        batch = _stack_td([b for b in batches if b is not None]).contiguous()
    keys = list(items[0].non_tensor_batch)
    for i, item in enumerate(items):
        if list(item.non_tensor_batch) != keys and set(item.non_tensor_batch) != set(keys):
            raise KeyMismatchError(
                f"collate_fn: row {i} has non-tensor keys {sorted(item.non_tensor_batch)}, "
                f"row 0 has {sorted(keys)}"
            )
    non_tensor = {k: _stack_values(k, [item.non_tensor_batch[k] for item in items]) for k in keys}
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(items[0].meta_info))


# --- DataProto -------------------------------------------------------------------------------


def _rebuild_data_proto(cls: type[D], state: dict[str, Any]) -> D:
    batch_state = state.get("batch")
    batch = None if batch_state is None else rebuild_tensordict(batch_state)
    obj = cls.__new__(cls)
    obj.batch = batch
    obj.non_tensor_batch = dict(state["non_tensor_batch"])
    obj.meta_info = dict(state["meta_info"])
    return obj


class DataProto:
    """A batch: tensor columns in a TensorDict, numpy columns, and batch-level ``meta_info``.

    Every column has the same number of rows (the first dimension). Construction validates
    that (see :meth:`check_consistency`). Operations that return a new DataProto give it a
    shallow copy of ``meta_info``; tensors and numpy columns are shared or viewed whenever
    possible. ``rename``, ``union``, ``reorder``, ``pop``, ``padding`` and ``to`` change the
    object in place, as in verl.
    """

    batch: TensorDictBase | None
    non_tensor_batch: dict[str, NDArray]
    meta_info: dict[str, Any]

    def __init__(
        self,
        batch: TensorDictBase | None = None,
        non_tensor_batch: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> None:
        if batch is not None and not isinstance(batch, TensorDictBase):
            raise ProtocolTypeError(
                f"DataProto: batch must be a TensorDict or None, got {type(batch).__name__}"
            )
        if non_tensor_batch is not None and not isinstance(non_tensor_batch, Mapping):
            raise ProtocolTypeError(
                f"DataProto: non_tensor_batch must be a dict of numpy arrays, "
                f"got {type(non_tensor_batch).__name__}"
            )
        if meta_info is not None and not isinstance(meta_info, Mapping):
            raise ProtocolTypeError(
                f"DataProto: meta_info must be a dict, got {type(meta_info).__name__}"
            )
        self.batch = batch
        self.non_tensor_batch = {k: _as_column(k, v) for k, v in (non_tensor_batch or {}).items()}
        self.meta_info = dict(meta_info or {})
        self.check_consistency()

    # -- construction --------------------------------------------------------------------

    @classmethod
    def from_dict(
        cls: type[D],
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> D:
        """Build from a dict of tensors, a dict of numpy columns (or lists) and ``meta_info``.

        The batch size is the first ``num_batch_dims`` dimensions of the tensors, which must
        all agree. ``auto_padding=True`` sets the per-object padding flag in ``meta_info``.
        """
        if not isinstance(num_batch_dims, int) or num_batch_dims < 1:
            raise InvalidSizeError(
                f"from_dict: num_batch_dims must be >= 1, got {num_batch_dims!r}"
            )
        tensors = dict(tensors or {})
        batch: TensorDict | None = None
        if tensors:
            batch_size: tuple[int, ...] | None = None
            first_key = ""
            for key, value in tensors.items():
                if not isinstance(value, torch.Tensor):
                    raise ProtocolTypeError(
                        f"from_dict: tensor column {key!r} must be a torch.Tensor, "
                        f"got {type(value).__name__}"
                    )
                if value.dim() < num_batch_dims:
                    raise BatchSizeMismatchError(
                        f"from_dict: tensor {key!r} has {value.dim()} dimensions, fewer than "
                        f"num_batch_dims={num_batch_dims}"
                    )
                dims = tuple(value.shape[:num_batch_dims])
                if batch_size is None:
                    batch_size, first_key = dims, key
                elif dims != batch_size:
                    raise BatchSizeMismatchError(
                        f"from_dict: tensor {key!r} has batch size {dims}, tensor "
                        f"{first_key!r} has {batch_size}"
                    )
            batch = TensorDict(tensors, batch_size=batch_size)
        meta = dict(meta_info or {})
        if auto_padding:
            meta[DataProtoConfig.auto_padding_key] = True
        return cls(batch=batch, non_tensor_batch=dict(non_tensors or {}), meta_info=meta)

    @classmethod
    def from_single_dict(
        cls: type[D],
        data: Mapping[str, torch.Tensor | NDArray],
        meta_info: Mapping[str, Any] | None = None,
        auto_padding: bool = False,
    ) -> D:
        """Build from one dict: tensors become tensor columns, numpy arrays non-tensor columns."""
        tensors: dict[str, torch.Tensor] = {}
        non_tensors: dict[str, NDArray] = {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray):
                non_tensors[key] = value
            else:
                raise ProtocolTypeError(
                    f"from_single_dict: value of {key!r} must be a torch.Tensor or a numpy "
                    f"array, got {type(value).__name__}"
                )
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    @classmethod
    def from_tensordict(
        cls: type[D],
        tensor_dict: TensorDictBase,
        meta_info: Mapping[str, Any] | None = None,
        num_batch_dims: int = 1,
    ) -> D:
        """Build from a TensorDict (verl's layout, and what :meth:`to_tensordict` writes):
        tensors (and nested TensorDicts) stay in ``batch``; non-tensor stacks become numpy
        columns (numeric and string values get their numpy dtype back, anything else an
        object column); non-tensor data entries go to ``meta_info``."""
        if not isinstance(tensor_dict, TensorDictBase):
            raise ProtocolTypeError(
                f"from_tensordict: expected a TensorDict, got {type(tensor_dict).__name__}"
            )
        if tensor_dict.batch_dims != num_batch_dims:
            raise BatchSizeMismatchError(
                f"from_tensordict: the TensorDict has {tensor_dict.batch_dims} batch dimensions "
                f"{tuple(tensor_dict.batch_size)}, expected num_batch_dims={num_batch_dims}"
            )
        meta = dict(meta_info or {})
        non_tensors: dict[str, NDArray] = {}
        keep: list[str] = []
        entries: list[tuple[str, Any]] = list(tensor_dict.items())
        for key, value in entries:
            if isinstance(value, NonTensorStack):
                non_tensors[key] = _stack_values(key, value.tolist())
            elif isinstance(value, NonTensorData):
                meta[key] = value.data
            else:
                keep.append(key)
        batch = tensor_dict.select(*keep) if keep else None
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    def to_tensordict(self) -> TensorDict:
        """One TensorDict holding the whole batch, in verl's layout: the tensor columns as
        they are (shared, not copied), each non-tensor column as a ``NonTensorStack`` and
        each ``meta_info`` entry as ``NonTensorData``. :meth:`from_tensordict` gives the
        DataProto back. A name used by two kinds of entry is a
        :class:`~sc_protocol.KeyConflictError`."""
        n = len(self)
        if self.batch is not None:
            td: TensorDict = TensorDict(
                dict(self.batch.items()), batch_size=self.batch.batch_size, device=self.batch.device
            )
        else:
            td = TensorDict({}, batch_size=[n])
        taken = {str(k) for k in td.keys()}  # noqa: SIM118 - a TensorDict, not a dict
        for key, column in self.non_tensor_batch.items():
            if key in taken:
                raise KeyConflictError(
                    f"DataProto.to_tensordict: {key!r} is both a tensor and a non-tensor column"
                )
            td.set(key, NonTensorStack(*[NonTensorData(v) for v in list(column)]))
            taken.add(key)
        for key, value in self.meta_info.items():
            if key in taken:
                raise KeyConflictError(
                    f"DataProto.to_tensordict: meta_info key {key!r} is also a column name"
                )
            td.set_non_tensor(key, value)
        return td

    # -- validation and basic protocol -------------------------------------------------

    def check_consistency(self) -> None:
        """Check that every column has the same number of rows; raise a typed error if not."""
        if self.batch is not None:
            if self.batch.batch_dims == 0:
                raise BatchSizeMismatchError(
                    "DataProto: batch has no batch dimension (batch_size=[]); "
                    "a DataProto needs at least one"
                )
            if self.non_tensor_batch and self.batch.batch_dims != 1:
                raise BatchSizeMismatchError(
                    f"DataProto: batch has {self.batch.batch_dims} batch dimensions "
                    f"{tuple(self.batch.batch_size)}; with non-tensor columns only one is "
                    "supported"
                )
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise ProtocolTypeError(
                    f"DataProto: non-tensor column {key!r} must be a numpy array, "
                    f"got {type(value).__name__}"
                )
        expected: int | None = None
        origin = ""
        if self.batch is not None:
            expected = int(self.batch.batch_size[0])
            origin = f"the tensor batch has {expected} rows"
        for key, value in self.non_tensor_batch.items():
            rows = int(value.shape[0]) if value.ndim else 0
            if expected is None:
                expected, origin = rows, f"non-tensor column {key!r} has {rows} rows"
            elif rows != expected:
                raise BatchSizeMismatchError(
                    f"DataProto: non-tensor column {key!r} has {rows} rows, but {origin}"
                )

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0

    def __repr__(self) -> str:
        keys = [] if self.batch is None else [_key_str(k) for k, _ in _leaves(self.batch)]
        return (
            f"{type(self).__name__}(rows={len(self)}, batch_keys=[{', '.join(keys)}], "
            f"non_tensor_keys={list(self.non_tensor_batch)}, meta_info_keys={list(self.meta_info)})"
        )

    def _new(self: D, batch: TensorDictBase | None, non_tensor: dict[str, NDArray]) -> D:
        """A new object of the same class, without re-validating what is known consistent."""
        obj = type(self).__new__(type(self))
        obj.batch = batch
        obj.non_tensor_batch = non_tensor
        obj.meta_info = dict(self.meta_info)
        return obj

    # -- indexing ------------------------------------------------------------------------

    @overload
    def __getitem__(self, item: int | np.integer[Any]) -> DataProtoItem: ...

    @overload
    def __getitem__(self: D, item: IndexLike) -> D: ...

    def __getitem__(self: D, item: Any) -> D | DataProtoItem:
        """``dp[i]`` is a :class:`DataProtoItem`; ``dp[a:b]``, ``dp[[i, j]]``, ``dp[array]``,
        ``dp[tensor]`` and ``dp[mask]`` are DataProtos."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (bool, np.bool_)):
            raise ProtocolTypeError(f"DataProto index must not be a bool, got {item!r}")
        if isinstance(item, (int, np.integer)):
            n = len(self)
            i = int(item)
            if i < -n or i >= n:
                raise IndexOutOfRangeError(f"DataProto index {i} is out of range for {n} rows")
            i %= n
            return DataProtoItem(
                batch=None if self.batch is None else self.batch[i],
                non_tensor_batch={k: v[i] for k, v in self.non_tensor_batch.items()},
                meta_info=dict(self.meta_info),
            )
        if isinstance(item, (list, tuple, range, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        raise ProtocolTypeError(
            f"DataProto index must be an int, a slice, a list/array/tensor of indices or a "
            f"boolean mask, got {type(item).__name__}"
        )

    def slice(
        self: D, start: int | None = None, end: int | None = None, step: int | None = None
    ) -> D:
        """Rows ``start:end:step`` as views (no copy)."""
        sl = slice(start, end, step)
        if step == 0:
            raise InvalidSizeError("DataProto.slice: step must not be zero")
        batch = None if self.batch is None else self.batch[sl]
        non_tensor = {k: v[sl] for k, v in self.non_tensor_batch.items()}
        return self._new(batch, non_tensor)

    def select_idxs(self: D, idxs: IndexLike) -> D:
        """Rows at ``idxs`` (list, numpy array or tensor of ints, or a boolean mask)."""
        positions, positions_t = _index_arrays(idxs, len(self), "DataProto.select_idxs")
        batch = None
        if self.batch is not None:
            index = positions_t
            if self.batch.device is not None and self.batch.device.type != "cpu":
                index = positions_t.to(self.batch.device)
            batch = self.batch[index]
        non_tensor = {k: v[positions] for k, v in self.non_tensor_batch.items()}
        return self._new(batch, non_tensor)

    def select(
        self: D,
        batch_keys: Sequence[Key] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> D:
        """A DataProto with only the given keys (``None`` keeps every key of that kind).

        Tensors are shared; ``deepcopy=True`` deep-copies the non-tensor columns and
        ``meta_info``.
        """
        self._require_keys("select", batch_keys, non_tensor_batch_keys, meta_info_keys)
        batch = self.batch
        if batch is not None:
            batch = batch.clone(False) if batch_keys is None else batch.select(*batch_keys)
        elif batch_keys:
            raise MissingKeyError(
                f"DataProto.select: batch keys {list(batch_keys)} requested, but the batch has "
                "no tensor columns"
            )
        if non_tensor_batch_keys is None:
            non_tensor = dict(self.non_tensor_batch)
        else:
            non_tensor = {k: self.non_tensor_batch[k] for k in non_tensor_batch_keys}
        if meta_info_keys is None:
            meta = dict(self.meta_info)
        else:
            meta = {k: self.meta_info[k] for k in meta_info_keys}
        if deepcopy:
            non_tensor = copy.deepcopy(non_tensor)
            meta = copy.deepcopy(meta)
        obj = self._new(batch, non_tensor)
        obj.meta_info = meta
        return obj

    def _require_keys(
        self,
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
        if batch_keys and self.batch is not None:
            available = [_key_str(k) for k in self.batch.keys(include_nested=True)]
            for key in batch_keys:
                if not _has_key(self.batch, key):
                    raise MissingKeyError(
                        f"DataProto.{what}: batch key {_key_str(key)} not found; "
                        f"batch keys are [{', '.join(available)}]"
                    )
        for key in non_tensor_batch_keys or ():
            if key not in self.non_tensor_batch:
                raise MissingKeyError(
                    f"DataProto.{what}: non-tensor key {key!r} not found; "
                    f"non-tensor keys are {sorted(self.non_tensor_batch)}"
                )
        for key in meta_info_keys or ():
            if key not in self.meta_info:
                raise MissingKeyError(
                    f"DataProto.{what}: meta_info key {key!r} not found; "
                    f"meta_info keys are {sorted(self.meta_info)}"
                )

    def pop(
        self: D,
        batch_keys: Sequence[Key] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> D:
        """Remove the given keys from this DataProto and return them as a new DataProto.

        Every key is checked before anything is removed.
        """
        batch_keys = list(batch_keys or [])
        non_tensor_batch_keys = list(non_tensor_batch_keys or [])
        meta_info_keys = list(meta_info_keys or [])
        if batch_keys and self.batch is None:
            raise MissingKeyError(
                f"DataProto.pop: batch keys {batch_keys} requested, but the batch has no tensor "
                "columns"
            )
        self._require_keys("pop", batch_keys, non_tensor_batch_keys, meta_info_keys)
        batch = None
        if batch_keys and self.batch is not None:
            popped = {key: self.batch.pop(key) for key in batch_keys}
            batch = TensorDict(popped, batch_size=self.batch.batch_size, device=self.batch.device)
        non_tensor = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys}
        meta = {k: self.meta_info.pop(k) for k in meta_info_keys}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def rename(
        self: D,
        old_keys: Key | Sequence[Key] | None = None,
        new_keys: Key | Sequence[Key] | None = None,
    ) -> D:
        """Rename columns in place (tensor or non-tensor), several at once; returns ``self``.

        Keys may be swapped (``rename(["a", "b"], ["b", "a"])``); a new name that is taken by
        a column not being renamed is an error.
        """
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
            if self.batch is not None and _has_key(self.batch, old):
                in_batch.append(True)
            elif isinstance(old, str) and old in self.non_tensor_batch:
                in_batch.append(False)
            else:
                raise MissingKeyError(f"DataProto.rename: key {_key_str(old)} not found")
        for old, new, tensor in zip(olds, news, in_batch, strict=True):
            taken = (self.batch is not None and _has_key(self.batch, new)) or (
                isinstance(new, str) and new in self.non_tensor_batch
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
            if tensor and self.batch is not None:
                values.append(self.batch.pop(old))
            else:
                values.append(self.non_tensor_batch.pop(str(old)))
        for new, tensor, value in zip(news, in_batch, values, strict=True):
            if tensor and self.batch is not None:
                self.batch.set(new, value)
            else:
                self.non_tensor_batch[str(new)] = value
        return self

    # -- joining -------------------------------------------------------------------------

    def union(self: D, other: DataProto) -> D:
        """Add ``other``'s columns and ``meta_info`` to this DataProto (in place); returns ``self``.

        Keys present on both sides must hold equal values. Either side may have no tensor
        columns. Nothing is changed when an error is raised.
        """
        if not isinstance(other, DataProto):
            raise ProtocolTypeError(
                f"DataProto.union: expected a DataProto, got {type(other).__name__}"
            )
        mine_cols = self.batch is not None or bool(self.non_tensor_batch)
        other_cols = other.batch is not None or bool(other.non_tensor_batch)
        if mine_cols and other_cols and len(self) != len(other):
            raise BatchSizeMismatchError(
                f"DataProto.union: this batch has {len(self)} rows, the other has {len(other)}"
            )
        # Validate everything first, then change.
        probe: TensorDictBase | None = None
        if self.batch is not None and other.batch is not None:
            probe = self.batch.clone(False)
            union_tensor_dict(probe, other.batch)
        union_numpy_dict(dict(self.non_tensor_batch), other.non_tensor_batch)
        _union_meta(dict(self.meta_info), other.meta_info, "DataProto.union")
        if self.batch is None:
            self.batch = None if other.batch is None else other.batch.clone(False)
        elif other.batch is not None:
            self.batch = probe
        union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        _union_meta(self.meta_info, other.meta_info, "DataProto.union")
        return self

    @staticmethod
    def concat(data: Sequence[D]) -> D:
        """Join DataProtos row-wise. All must have the same keys.

        ``meta_info`` is merged as verl does: a key that several parts carry must have equal
        values (else a :class:`~sc_protocol.KeyConflictError` naming the key and both
        values), and ``meta_info["metrics"]`` -- a dict, or a list of dicts, per part -- is
        gathered into one dict of lists across the parts (``{"loss": [part0, part1]}``).
        """
        parts = list(data)
        if not parts:
            raise InvalidSizeError("DataProto.concat: nothing to concatenate (empty list)")
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

    # -- splitting -----------------------------------------------------------------------

    def is_padding_enabled(self) -> bool:
        """Whether this batch may be padded: its own flag or the global switch."""
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or bool(
            DataProtoConfig.auto_padding
        )

    def chunk(self: D, chunks: int) -> list[D]:
        """Split into exactly ``chunks`` parts of views.

        Splitting is exact, as in verl: rows that do not divide evenly into ``chunks`` are an
        :class:`~sc_protocol.InvalidSizeError` naming both, unless padding is enabled for
        this batch (:meth:`is_padding_enabled`); then earlier parts are one row longer, and
        parts beyond the rows are empty (at most ``8 x`` as many parts as rows).
        """
        if isinstance(chunks, bool) or not isinstance(chunks, int):
            raise ProtocolTypeError(f"DataProto.chunk: chunks must be an int, got {chunks!r}")
        n = len(self)
        if chunks < 1:
            raise InvalidSizeError(f"DataProto.chunk: chunks must be >= 1, got {chunks} ({n} rows)")
        if n % chunks and not self.is_padding_enabled():
            raise InvalidSizeError(
                f"DataProto.chunk: {n} rows do not divide evenly into {chunks} chunks "
                f"({n} % {chunks} = {n % chunks}); pad the batch first "
                "(pad_dataproto_to_divisor) or enable auto-padding"
            )
        if chunks > max(n, 1) * _MAX_CHUNKS_PER_ROW:
            raise InvalidSizeError(
                f"DataProto.chunk: {chunks} chunks for {n} rows is more than "
                f"{_MAX_CHUNKS_PER_ROW} chunks per row; ask for at most "
                f"{max(n, 1) * _MAX_CHUNKS_PER_ROW}"
            )
        base, extra = divmod(n, chunks)
        sizes = [base + 1 if i < extra else base for i in range(chunks)]
        return self._split_sizes(sizes)

    def _split_sizes(self: D, sizes: list[int]) -> list[D]:
        batches: list[TensorDictBase | None]
        if self.batch is None:
            batches = [None] * len(sizes)
        else:
            batches = list(self.batch.split(sizes, dim=0))
        out: list[D] = []
        start = 0
        for size, batch in zip(sizes, batches, strict=True):
            stop = start + size
            non_tensor = {k: v[start:stop] for k, v in self.non_tensor_batch.items()}
            out.append(self._new(batch, non_tensor))
            start = stop
        return out

    def split(self: D, split_size: int) -> list[D]:
        """Consecutive parts of ``split_size`` rows (the last may be shorter)."""
        if isinstance(split_size, bool) or not isinstance(split_size, int) or split_size < 1:
            raise InvalidSizeError(
                f"DataProto.split: split_size must be a positive int, got {split_size!r}"
            )
        n = len(self)
        sizes = [min(split_size, n - start) for start in range(0, n, split_size)]
        return self._split_sizes(sizes) if sizes else []

    # -- reshaping rows ------------------------------------------------------------------

    def reorder(self, indices: IndexLike) -> None:
        """Reorder rows in place by ``indices`` (list, numpy array or tensor)."""
        positions, positions_t = _index_arrays(indices, len(self), "DataProto.reorder")
        if self.batch is not None:
            index = positions_t
            if self.batch.device is not None and self.batch.device.type != "cpu":
                index = positions_t.to(self.batch.device)
            self.batch = self.batch[index]
        self.non_tensor_batch = {k: v[positions] for k, v in self.non_tensor_batch.items()}

    def _take(self: D, positions: NDArray) -> D:
        positions = positions.astype(np.int64, copy=False)
        batch = None
        if self.batch is not None:
            index = torch.from_numpy(positions)
            if self.batch.device is not None and self.batch.device.type != "cpu":
                index = index.to(self.batch.device)
            batch = self.batch[index]
        non_tensor = {k: v[positions] for k, v in self.non_tensor_batch.items()}
        return self._new(batch, non_tensor)

    def repeat(self: D, repeat_times: int = 2, interleave: bool = True) -> D:
        """Repeat every row ``repeat_times`` times: ``aabb`` (interleave) or ``abab``."""
        if isinstance(repeat_times, bool) or not isinstance(repeat_times, int) or repeat_times < 0:
            raise InvalidSizeError(
                f"DataProto.repeat: repeat_times must be a non-negative int, got {repeat_times!r}"
            )
        rows = np.arange(len(self), dtype=np.int64)
        positions = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return self._take(positions)

    def sample_level_repeat(
        self: D, repeat_times: int | Sequence[int] | NDArray | torch.Tensor
    ) -> D:
        """Repeat row ``i`` ``repeat_times[i]`` times (interleaved)."""
        if isinstance(repeat_times, int) and not isinstance(repeat_times, bool):
            return self.repeat(repeat_times, interleave=True)
        if isinstance(repeat_times, torch.Tensor):
            counts = repeat_times.detach().cpu().reshape(-1).numpy()
        else:
            counts = np.asarray(repeat_times).reshape(-1)
        if counts.size and not np.issubdtype(counts.dtype, np.integer):
            raise ProtocolTypeError(
                f"DataProto.sample_level_repeat: repeat counts must be integers, got {counts.dtype}"
            )
        if counts.shape[0] != len(self):
            raise BatchSizeMismatchError(
                f"DataProto.sample_level_repeat: {counts.shape[0]} repeat counts for "
                f"{len(self)} rows"
            )
        if counts.size and int(counts.min()) < 0:
            raise InvalidSizeError(
                "DataProto.sample_level_repeat: repeat counts must be >= 0, "
                f"got {int(counts.min())}"
            )
        positions = np.repeat(np.arange(len(self), dtype=np.int64), counts.astype(np.int64))
        return self._take(positions)

    def unfold_column_chunks(self: D, n_split: int, split_keys: Sequence[Key] | None = None) -> D:
        """Turn every row into ``n_split`` rows.

        Columns in ``split_keys`` (tensor or non-tensor) are cut along their second dimension
        into ``n_split`` pieces, one per new row; every other column is repeated.
        """
        if isinstance(n_split, bool) or not isinstance(n_split, int) or n_split < 1:
            raise InvalidSizeError(
                f"DataProto.unfold_column_chunks: n_split must be a positive int, got {n_split!r}"
            )
        split = list(split_keys or [])
        known_batch = [] if self.batch is None else list(self.batch.keys(include_nested=True))
        for key in split:
            if key not in known_batch and key not in self.non_tensor_batch:
                raise MissingKeyError(
                    f"DataProto.unfold_column_chunks: split key {_key_str(key)} not found"
                )
        n = len(self)

        def unfold_shape(key: Key, shape: tuple[int, ...]) -> tuple[int, ...]:
            if len(shape) < 2:
                raise BatchSizeMismatchError(
                    f"DataProto.unfold_column_chunks: column {_key_str(key)} has shape {shape}; "
                    "a split column needs a second dimension"
                )
            if shape[1] % n_split:
                raise InvalidSizeError(
                    f"DataProto.unfold_column_chunks: column {_key_str(key)} has {shape[1]} "
                    f"entries in dimension 1, not divisible by n_split={n_split}"
                )
            return (shape[0] * n_split, shape[1] // n_split, *shape[2:])

        batch = None
        if self.batch is not None:
            source: dict[Key, torch.Tensor] = {}
            for key, value in _leaves(self.batch):
                if key in split:
                    source[key] = value.reshape(unfold_shape(key, tuple(value.shape)))
                else:
                    source[key] = value.repeat_interleave(n_split, dim=0)
            batch = TensorDict(batch_size=[n * n_split], device=self.batch.device)
            for key, value in source.items():
                batch.set(key, value)
        non_tensor: dict[str, NDArray] = {}
        for key, value in self.non_tensor_batch.items():
            if key in split:
                non_tensor[key] = value.reshape(unfold_shape(key, tuple(value.shape)))
            else:
                non_tensor[key] = np.repeat(value, n_split, axis=0)
        return self._new(batch, non_tensor)

    # -- padding -------------------------------------------------------------------------

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` rows in place.

        ``padding_candidate`` chooses them, as in verl: ``""`` (the default) and ``"last"``
        repeat the last row, ``"first"`` repeats the first row. (The padding that dispatch
        adds, like :func:`pad_dataproto_to_divisor`, repeats rows from the start instead.)
        """
        if isinstance(padding_size, bool) or not isinstance(padding_size, int) or padding_size < 0:
            raise InvalidSizeError(
                f"DataProto.padding: padding_size must be a non-negative int, got {padding_size!r}"
            )
        if padding_size == 0:
            return
        n = len(self)
        if n == 0:
            raise InvalidSizeError(
                f"DataProto.padding: cannot pad an empty batch with {padding_size} rows"
            )
        if padding_candidate == "first":
            extra = np.zeros(padding_size, dtype=np.int64)
        elif padding_candidate in ("", "last"):
            extra = np.full(padding_size, n - 1, dtype=np.int64)
        else:
            raise ProtocolTypeError(
                f"DataProto.padding: padding_candidate must be '', 'first' or 'last', "
                f"got {padding_candidate!r}"
            )
        padded = _pad_rows(self, extra)
        self.batch = padded.batch
        self.non_tensor_batch = padded.non_tensor_batch

    # -- devices, iteration, inspection ------------------------------------------------

    def to(self: D, device: str | torch.device) -> D:
        """Move the tensor columns to ``device`` (in place); returns ``self``."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: Mapping[str, Any] | None = None,
    ) -> Iterator[DataProto]:
        """Iterate over mini-batches of ``mini_batch_size`` rows for ``epochs`` epochs.

        ``mini_batch_size`` must divide the number of rows. ``dataloader_kwargs`` go to
        :class:`torch.utils.data.DataLoader` (for example ``{"shuffle": True}``); ``seed``
        seeds its generator. Every mini-batch carries this batch's ``meta_info``.
        """
        n = len(self)
        if isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int):
            raise ProtocolTypeError(
                f"make_iterator: mini_batch_size must be an int, got {mini_batch_size!r}"
            )
        if mini_batch_size < 1 or n % mini_batch_size:
            raise InvalidSizeError(
                f"make_iterator: mini_batch_size {mini_batch_size} must be positive and divide "
                f"the {n} rows"
            )
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise InvalidSizeError(
                f"make_iterator: epochs must be a non-negative int, got {epochs!r}"
            )
        from torch.utils.data import DataLoader

        generator = None
        if seed is not None:
            generator = torch.Generator()
            generator.manual_seed(seed)
        # The loader batches row indices; each mini-batch is one select_idxs (not one
        # DataProtoItem per row, stacked again).
        loader: DataLoader[Any] = DataLoader(
            dataset=range(n),  # type: ignore[arg-type]  # a Sequence works; stubs want Dataset
            batch_size=mini_batch_size,
            collate_fn=_SelectRows(self),
            generator=generator,
            **dict(dataloader_kwargs or {}),
        )
        meta = self.meta_info

        def generate() -> Iterator[DataProto]:
            for _ in range(epochs):
                for mini_batch in loader:
                    mini_batch.meta_info = dict(meta)
                    yield mini_batch

        return iter(generate())

    def get_data_info(self) -> str:
        """A multi-line description of every column: key, shape, dtype, device."""
        lines = [f"{type(self).__name__} with {len(self)} rows"]
        lines.append("batch:")
        if self.batch is None:
            lines.append("  (none)")
        else:
            for key, value in _leaves(self.batch):
                if isinstance(value, torch.Tensor):
                    lines.append(
                        f"  {_key_str(key)}: shape={tuple(value.shape)}, dtype={value.dtype}, "
                        f"device={value.device}"
                    )
                else:
                    lines.append(f"  {_key_str(key)}: {type(value).__name__}")
        lines.append("non_tensor_batch:")
        if not self.non_tensor_batch:
            lines.append("  (none)")
        for key, arr in self.non_tensor_batch.items():
            lines.append(f"  {key!r}: shape={arr.shape}, dtype={arr.dtype}")
        lines.append(f"meta_info: {sorted(self.meta_info)}")
        return "\n".join(lines)

    def print_size(self, prefix: str = "") -> str:
        """Log (at INFO, logger ``sc_protocol``) and return the size of the batch in GiB."""
        tensor_bytes = 0
        if self.batch is not None:
            for _, value in _leaves(self.batch):
                if isinstance(value, torch.Tensor):
                    tensor_bytes += _tensor_nbytes(value)
        numpy_bytes = sum(int(v.nbytes) for v in self.non_tensor_batch.values())
        message = (
            f"{prefix}size of tensordict: {tensor_bytes / 2**30:.6f} GB, "
            f"size of non_tensor_batch: {numpy_bytes / 2**30:.6f} GB"
        )
        logger.info(message)
        return message

    # -- copying and serialization -----------------------------------------------------

    def __copy__(self: D) -> D:
        """A shallow copy shares the batch object, the columns and ``meta_info`` values."""
        obj = self._new(self.batch, dict(self.non_tensor_batch))
        return obj

    def __deepcopy__(self: D, memo: dict[int, Any]) -> D:
        """A deep copy clones every tensor and deep-copies the columns and ``meta_info``."""
        obj = type(self).__new__(type(self))
        memo[id(self)] = obj
        obj.batch = None if self.batch is None else self.batch.clone()
        obj.non_tensor_batch = copy.deepcopy(self.non_tensor_batch, memo)
        obj.meta_info = copy.deepcopy(self.meta_info, memo)
        return obj

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        proto = int(protocol) if isinstance(protocol, int) else pickle.DEFAULT_PROTOCOL
        state = {
            "batch": None if self.batch is None else tensordict_state(self.batch, proto),
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }
        return (_rebuild_data_proto, (type(self), state))

    def save_to_disk(self, filepath: str | os.PathLike[str]) -> None:
        """Write this batch to ``filepath`` atomically (temporary file, then rename).

        The file is a ``torch.save`` archive of tensors and plain Python values, which
        :meth:`load_from_disk` reads with ``weights_only=True`` unless a column or
        ``meta_info`` holds arbitrary Python objects.
        """
        payload = _to_payload(self)
        path = os.fspath(filepath)
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".sc-protocol-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save(payload, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load_from_disk(
        cls: type[D], filepath: str | os.PathLike[str], weights_only: bool | None = None
    ) -> D:
        """Read a batch written by :meth:`save_to_disk`.

        ``weights_only=None`` (default) loads with ``torch.load(weights_only=True)`` and
        falls back to full unpickling only if the file holds arbitrary Python objects (as
        verl, which always unpickles; load only files you trust). ``True`` never unpickles
        arbitrary objects and raises :class:`SerializationError` instead; ``False`` always
        unpickles.
        """
        path = os.fspath(filepath)
        if weights_only is False:
            payload = torch.load(path, weights_only=False)
        else:
            try:
                with warnings.catch_warnings():
                    # torch announces a sparse-invariant scan on every weights_only load.
                    warnings.filterwarnings(
                        "ignore", message=".*sparse tensor invariants.*", category=UserWarning
                    )
                    payload = torch.load(path, weights_only=True)
            except pickle.UnpicklingError as exc:
                if weights_only:
                    raise SerializationError(
                        f"load_from_disk: {path!r} holds Python objects that weights_only "
                        f"loading refuses ({exc}); pass weights_only=False for a trusted file"
                    ) from exc
                logger.debug("load_from_disk: %s needs full unpickling: %s", path, exc)
                payload = torch.load(path, weights_only=False)
        return _from_payload(cls, payload, path)


class _SelectRows:
    """``collate_fn`` for :meth:`DataProto.make_iterator`: row indices to a DataProto."""

    def __init__(self, data: DataProto) -> None:
        self.data = data

    def __call__(self, indices: list[int]) -> DataProto:
        return self.data.select_idxs(np.asarray(indices, dtype=np.int64))


# --- padding functions -----------------------------------------------------------------------


def _pad_rows(data: D, extra: NDArray) -> D:
    return DataProto.concat([data, data._take(extra)])


def pad_dataproto_to_divisor(data: D, size_divisor: int) -> tuple[D, int]:
    """Pad ``data`` (on a new object) to a multiple of ``size_divisor`` rows.

    The padding repeats rows from the start, cycling if needed. Returns the padded batch and
    the number of rows added; ``data`` itself is never changed.
    """
    if not isinstance(data, DataProto):
        raise ProtocolTypeError(
            f"pad_dataproto_to_divisor: expected a DataProto, got {type(data).__name__}"
        )
    if isinstance(size_divisor, bool) or not isinstance(size_divisor, int) or size_divisor < 1:
        raise InvalidSizeError(
            f"pad_dataproto_to_divisor: size_divisor must be a positive int, got {size_divisor!r}"
        )
    n = len(data)
    pad_size = (-n) % size_divisor
    if pad_size == 0:
        return data, 0
    if n == 0:
        raise InvalidSizeError(
            f"pad_dataproto_to_divisor: cannot pad an empty batch to a multiple of {size_divisor}"
        )
    return _pad_rows(data, np.arange(pad_size, dtype=np.int64) % n), pad_size


def unpad_dataproto(data: D, pad_size: int) -> D:
    """Drop the last ``pad_size`` rows (a view; ``data`` itself is unchanged)."""
    if isinstance(pad_size, bool) or not isinstance(pad_size, int) or pad_size < 0:
        raise InvalidSizeError(
            f"unpad_dataproto: pad_size must be a non-negative int, got {pad_size!r}"
        )
    if pad_size > len(data):
        raise InvalidSizeError(
            f"unpad_dataproto: cannot drop {pad_size} padding rows from a batch of {len(data)}"
        )
    if pad_size == 0:
        return data
    return data.slice(0, len(data) - pad_size)


# --- the on-disk format ---------------------------------------------------------------------


def _column_payload(arr: NDArray) -> dict[str, Any]:
    if arr.dtype == object:
        return {"kind": "object", "shape": list(arr.shape), "items": list(arr.ravel())}
    if arr.dtype.kind in "US":
        return {
            "kind": "str",
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
            "items": arr.ravel().tolist(),
        }
    if arr.dtype.kind in "biufc" and arr.dtype.isnative:
        try:
            tensor = torch.from_numpy(np.ascontiguousarray(arr))
        except TypeError:
            pass
        else:
            return {"kind": "numeric", "dtype": arr.dtype.str, "tensor": tensor}
    return {"kind": "ndarray", "array": arr}


def _column_from_payload(key: str, payload: Mapping[str, Any], path: str) -> NDArray:
    kind = payload.get("kind")
    if kind == "object":
        flat = _object_column(payload["items"])
        return flat.reshape(tuple(payload["shape"]))
    if kind == "str":
        return np.array(payload["items"], dtype=np.dtype(payload["dtype"])).reshape(
            tuple(payload["shape"])
        )
    if kind == "numeric":
        arr: NDArray = payload["tensor"].numpy()
        return arr.astype(np.dtype(payload["dtype"]), copy=False)
    if kind == "ndarray":
        out: NDArray = payload["array"]
        return out
    raise SerializationError(f"load_from_disk: {path!r}: column {key!r} has unknown kind {kind!r}")


def _batch_payload(td: TensorDictBase) -> dict[str, Any]:
    entries: dict[str, Any] = {}
    for key, value in td.items():
        if isinstance(value, torch.Tensor):
            entries[key] = {"kind": "tensor", "tensor": value}
        elif isinstance(value, TensorDict):
            entries[key] = {"kind": "td", "td": _batch_payload(value)}
        else:
            entries[key] = {"kind": "obj", "value": value}
    return {
        "batch_size": list(td.batch_size),
        "device": None if td.device is None else str(td.device),
        "entries": entries,
    }


def _batch_from_payload(payload: Mapping[str, Any]) -> TensorDict:
    source: dict[str, Any] = {}
    for key, entry in payload["entries"].items():
        if entry["kind"] == "tensor":
            source[key] = entry["tensor"]
        elif entry["kind"] == "td":
            source[key] = _batch_from_payload(entry["td"])
        else:
            source[key] = entry["value"]
    return TensorDict(source, batch_size=payload["batch_size"], device=payload["device"])


def _to_payload(data: DataProto) -> dict[str, Any]:
    return {
        "format": _SAVE_FORMAT,
        "version": _SAVE_VERSION,
        "batch": None if data.batch is None else _batch_payload(data.batch),
        "non_tensor_batch": {k: _column_payload(v) for k, v in data.non_tensor_batch.items()},
        "meta_info": data.meta_info,
    }


def _from_payload(cls: type[D], payload: Any, path: str) -> D:
    if not isinstance(payload, dict) or payload.get("format") != _SAVE_FORMAT:
        raise SerializationError(f"load_from_disk: {path!r} is not a file written by save_to_disk")
    if payload.get("version") != _SAVE_VERSION:
        raise SerializationError(
            f"load_from_disk: {path!r} has format version {payload.get('version')!r}; this "
            f"sc-protocol reads version {_SAVE_VERSION}"
        )
    batch = None if payload["batch"] is None else _batch_from_payload(payload["batch"])
    non_tensor = {
        k: _column_from_payload(k, v, path) for k, v in payload["non_tensor_batch"].items()
    }
    return cls(batch=batch, non_tensor_batch=non_tensor, meta_info=payload["meta_info"])
