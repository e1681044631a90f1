"""Folding rows into groups and back: verl's ``fold_batch_dim`` and ``unfold_batch_dim``.

A DataProto has one batch dimension. Folding ``n`` rows into ``g`` groups gives a batch of
``g`` rows whose columns carry the ``n // g`` rows of each group in their second dimension
(``[n, ...]`` becomes ``[g, n // g, ...]``); unfolding merges the leading dimensions of
every column back into rows. Neither changes its argument (verl's versions rewrite the
argument's non-tensor columns and batch size in place); tensors and numpy columns are
viewed, not copied, where their memory allows.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch
from tensordict import TensorDictBase

from ._columns import NDArray, _key_str, _leaves
from ._data_proto import DataProto
from ._errors import BatchSizeMismatchError, InvalidSizeError, ProtocolTypeError

__all__ = ["fold_batch_dim", "unfold_batch_dim"]

D = TypeVar("D", bound=DataProto)


def _positive_int(where: str, name: str, value: object, least: int) -> int:
    if type(value) is not int or value < least:
        raise InvalidSizeError(f"{where}: {name} must be an int >= {least}, got {value!r}")
    return value


def _check_data(where: str, data: object) -> DataProto:
    if not isinstance(data, DataProto):
        raise ProtocolTypeError(f"{where}: expected a DataProto, got {type(data).__name__}")
    return data


def fold_batch_dim(data: D, new_batch_size: int) -> D:
    """Fold the rows of ``data`` into ``new_batch_size`` groups of consecutive rows.

    Every tensor ``[n, ...]`` becomes ``[new_batch_size, n // new_batch_size, ...]`` and
    every numpy column likewise; the result has ``new_batch_size`` rows and a shallow copy
    of ``meta_info``. Rows that do not divide into ``new_batch_size`` groups are an
    :class:`~sc_protocol.InvalidSizeError` naming both numbers.
    """
    where = "fold_batch_dim"
    _check_data(where, data)
    groups = _positive_int(where, "new_batch_size", new_batch_size, 1)
    rows = len(data)
    if rows % groups:
        raise InvalidSizeError(
            f"{where}: {rows} rows do not fold into {groups} groups of equal size"
        )
    batch: TensorDictBase | None = None
    if data.batch is not None:
        batch = data.batch.reshape(groups, rows // groups)
        batch.batch_size = torch.Size([groups])
    non_tensors = {
        key: np.reshape(value, (groups, rows // groups, *value.shape[1:]))
        for key, value in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensors, meta_info=data.meta_info)


def unfold_batch_dim(data: D, batch_dims: int = 2) -> D:
    """Merge the first ``batch_dims`` dimensions of every column into rows: the inverse of
    :func:`fold_batch_dim` (``[g, k, ...]`` becomes ``[g * k, ...]`` for ``batch_dims=2``).

    Every tensor and numpy column must have at least ``batch_dims`` dimensions and the same
    leading ``batch_dims`` sizes; otherwise a
    :class:`~sc_protocol.BatchSizeMismatchError` names the column and both shapes.
    """
    where = "unfold_batch_dim"
    _check_data(where, data)
    dims = _positive_int(where, "batch_dims", batch_dims, 1)
    leading: tuple[int, ...] | None = None
    first = ""
    columns: list[tuple[str, tuple[int, ...]]] = []
    if data.batch is not None:
        columns += [(_key_str(key), tuple(value.shape)) for key, value in _leaves(data.batch)]
    columns += [(repr(key), tuple(value.shape)) for key, value in data.non_tensor_batch.items()]
    for name, shape in columns:
        if len(shape) < dims:
            raise BatchSizeMismatchError(
                f"{where}: column {name} has shape {list(shape)}, fewer than batch_dims={dims} "
                "dimensions"
            )
        if leading is None:
            leading, first = shape[:dims], name
        elif shape[:dims] != leading:
            raise BatchSizeMismatchError(
                f"{where}: column {name} has leading dimensions {list(shape[:dims])}, "
                f"column {first} has {list(leading)}"
            )
    if leading is None:
        raise InvalidSizeError(f"{where}: the batch has no columns to unfold")
    rows = int(np.prod(leading))
    batch: TensorDictBase | None = None
    if data.batch is not None:
        batch = data.batch.copy()  # shallow: setting the batch size must not touch ``data``
        batch.batch_size = torch.Size(leading)
        batch = batch.reshape(rows)
    non_tensors: dict[str, NDArray] = {
        key: np.reshape(value, (rows, *value.shape[dims:]))
        for key, value in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensors, meta_info=data.meta_info)
