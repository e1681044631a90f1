"""What a batch is made of: column types, key spelling, index normalisation, small helpers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ._errors import (
    BatchSizeMismatchError,
    IndexOutOfRangeError,
    ProtocolTypeError,
)

NDArray = np.ndarray[Any, Any]
Key = str | tuple[str, ...]
#: What selects rows: a slice, a sequence / numpy array / tensor of indices, or a boolean mask.
IndexLike = slice | Sequence[int] | Sequence[bool] | NDArray | torch.Tensor


#: dtypes numpy holds as they are (bfloat16 and the float8 kinds are not among them).
_NUMPY_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    }
)


def _numpy_joinable(parts: Sequence[TensorDictBase]) -> list[Any] | None:
    """The leaf keys of ``parts`` if every part is a plain 1-d-batch TensorDict on the CPU with
    the same keys and leaves numpy can hold (dense, no gradient); else ``None``."""
    first = parts[0]
    if type(first) is not TensorDict or first.batch_dims != 1:
        return None
    keys = list(first.keys(include_nested=True, leaves_only=True))
    for part in parts:
        if type(part) is not TensorDict or part.batch_dims != 1:
            return None
        if set(part.keys(include_nested=True, leaves_only=True)) != set(keys):
            return None
        for key in keys:
            leaf = part.get(key)
            if (
                not isinstance(leaf, torch.Tensor)
                or leaf.device.type != "cpu"
                or leaf.layout is not torch.strided
                or leaf.requires_grad
                or leaf.dtype not in _NUMPY_DTYPES
                or leaf.dtype != first.get(key).dtype
                or leaf.shape[1:] != first.get(key).shape[1:]
            ):
                return None
    return keys


def cat_tensordicts(parts: Sequence[TensorDictBase]) -> TensorDictBase:
    """The TensorDicts ``parts`` joined along dimension 0.

    Plain CPU columns are joined with ``numpy.concatenate``, which copies each column once on
    the calling thread: ``torch.cat`` splits the copy over torch's intra-op threads, which on a
    loaded machine wait for each other (measured 10-40x slower on a busy 2-core host). Other
    TensorDicts (GPU tensors, bfloat16, nested layouts, lazy stacks) take ``torch.cat``.
    """
    keys = _numpy_joinable(parts) if parts else None
    if keys is None:
        out: TensorDictBase = cast(Any, torch.cat)(list(parts), dim=0)
        return out
    rows = sum(int(p.batch_size[0]) for p in parts)
    joined = TensorDict({}, batch_size=[rows])
    for key in keys:
        arrays = [p.get(key).numpy() for p in parts]
        joined.set(key, torch.from_numpy(np.concatenate(arrays, axis=0)))
    return joined


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


def _list_column(values: list[Any] | tuple[Any, ...]) -> NDArray:
    """A column from a list, by verl's rule (``np.array(values, dtype=object)``): rows that
    are lists of one length make a 2-d object array (``column[:, j]`` works), ragged rows a
    1-d array of lists. Rows numpy cannot lay out (arrays of different shapes) stay a 1-d
    array of the rows as they are."""
    try:
        out = np.array(values, dtype=object)
    except ValueError:
        return _object_column(values)
    return out if out.ndim >= 1 else _object_column(values)


def _as_column(key: str, value: Any) -> NDArray:
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            raise ProtocolTypeError(
                f"non-tensor column {key!r} is a 0-d numpy array; a column needs one entry per row"
            )
        return value
    if isinstance(value, (list, tuple)):
        return _list_column(value)
    raise ProtocolTypeError(
        f"non-tensor column {key!r} must be a numpy array (or a list), got {type(value).__name__}"
    )


def check_arguments(batch: Any, non_tensor_batch: Any, meta_info: Any) -> None:
    """The DataProto constructor's argument types: a TensorDict (or ``None``) and mappings."""
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


def check_columns(batch: TensorDictBase | None, non_tensor: Mapping[str, Any]) -> None:
    """``DataProto.check_consistency``: the batch has one batch dimension and every column
    (numpy arrays only) the same number of rows; a typed error names the first that does
    not."""
    if batch is not None and batch.batch_dims != 1:
        raise BatchSizeMismatchError(
            f"DataProto: batch has {batch.batch_dims} batch dimensions "
            f"{list(batch.batch_size)}; a DataProto has exactly one, its rows "
            "(as in verl): give the TensorDict batch_size=[rows], or fold the extra "
            "dimensions with fold_batch_dim / unfold_batch_dim"
        )
    for key, value in non_tensor.items():
        if not isinstance(value, np.ndarray):
            raise ProtocolTypeError(
                f"DataProto: non-tensor column {key!r} must be a numpy array, "
                f"got {type(value).__name__}"
            )
    expected: int | None = None
    origin = ""
    if batch is not None:
        expected = int(batch.batch_size[0])
        origin = f"the tensor batch has {expected} rows"
    for key, value in non_tensor.items():
        rows = int(value.shape[0]) if value.ndim else 0
        if expected is None:
            expected, origin = rows, f"non-tensor column {key!r} has {rows} rows"
        elif rows != expected:
            raise BatchSizeMismatchError(
                f"DataProto: non-tensor column {key!r} has {rows} rows, but {origin}"
            )


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


def _index_arrays(index: Any, length: int, what: str) -> NDArray:
    """Normalize an index list / array / tensor / mask to int64 positions, validated."""
    if isinstance(index, torch.Tensor):
        arr = index.detach().cpu().numpy()
    elif isinstance(index, np.ndarray):
        arr = index
    elif isinstance(index, (list, tuple, range)):
        try:
            arr = np.asarray(index)
        except OverflowError:  # ints beyond 64 bits
            arr = np.asarray(index, dtype=object)
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
    elif np.issubdtype(arr.dtype, np.integer) or (
        arr.dtype == object and all(isinstance(v, (int, np.integer)) for v in arr.tolist())
    ):
        # Checked on the exact values before any cast: a uint64 2**64 - 1 must not wrap
        # around to -1 (the last row).
        if arr.size:
            low, high = int(arr.min()), int(arr.max())
            if low < -length or high >= length:
                bad = low if low < -length else high
                raise IndexOutOfRangeError(
                    f"{what}: index {bad} is out of range for a batch of {length} rows"
                )
        positions = arr.astype(np.int64, copy=True)
        positions[positions < 0] += length
    else:
        raise ProtocolTypeError(
            f"{what}: indices must be integers or booleans, got dtype {arr.dtype}"
        )
    return positions


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _stack_values(key: str, values: list[Any]) -> NDArray:
    """One column from per-row values: stacked arrays or scalars keep their numpy dtype,
    anything else becomes an object column."""
    if values and all(isinstance(v, np.ndarray) for v in values):
        shapes = {v.shape for v in values}
        if len(shapes) == 1:
            return np.stack(values)
    if values and all(isinstance(v, np.generic) for v in values):
        return np.array(values)
    return _object_column(values)
