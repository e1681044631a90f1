"""Conversions between plain columns (a batch TensorDict or ``None``, a dict of numpy
columns, ``meta_info``) and the containers a DataProto is built from or turned into: dicts
of tensors and numpy columns, and TensorDicts in verl's layout. The DataProto constructors
and ``to_tensordict`` call these."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from ._columns import NDArray, _stack_values
from ._config import DataProtoConfig
from ._errors import BatchSizeMismatchError, InvalidSizeError, KeyConflictError, ProtocolTypeError

__all__ = ["columns_from_dict", "columns_from_tensordict", "columns_to_tensordict", "split_dict"]

#: What a constructor gets: tensor columns (or ``None``), non-tensor columns, ``meta_info``.
Parts = tuple[TensorDictBase | None, dict[str, Any], dict[str, Any]]


def _check_one_batch_dim(where: str, num_batch_dims: object) -> None:
    # verl's signature keeps the parameter, and verl refuses any value but 1 (an assertion).
    if type(num_batch_dims) is not int or num_batch_dims != 1:
        raise InvalidSizeError(
            f"{where}: num_batch_dims must be 1 (a DataProto has one batch dimension, its "
            f"rows), got {num_batch_dims!r}"
        )


def columns_from_dict(
    tensors: Mapping[str, torch.Tensor] | None,
    non_tensors: Mapping[str, Any] | None,
    meta_info: Mapping[str, Any] | None,
    num_batch_dims: int,
    auto_padding: bool,
) -> Parts:
    """``DataProto.from_dict``: the tensors in one TensorDict (their first dimensions must
    agree), the non-tensor columns and ``meta_info`` copied, the padding flag set with
    ``auto_padding``."""
    _check_one_batch_dim("from_dict", num_batch_dims)
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
            if value.dim() == 0:
                raise BatchSizeMismatchError(
                    f"from_dict: tensor {key!r} has 0 dimensions; a column needs one entry per row"
                )
            dims = tuple(value.shape[:1])
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
    return batch, dict(non_tensors or {}), meta


def split_dict(
    data: Mapping[str, torch.Tensor | NDArray],
) -> tuple[dict[str, torch.Tensor], dict[str, NDArray]]:
    """``DataProto.from_single_dict``: the tensors and the numpy arrays of ``data``."""
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
    return tensors, non_tensors


def columns_from_tensordict(
    tensor_dict: TensorDictBase, meta_info: Mapping[str, Any] | None, num_batch_dims: int
) -> Parts:
    """``DataProto.from_tensordict``: tensors (and nested TensorDicts) stay in the batch;
    non-tensor stacks become numpy columns (numeric and string values get their numpy dtype
    back, anything else an object column); non-tensor data entries go to ``meta_info``."""
    if not isinstance(tensor_dict, TensorDictBase):
        raise ProtocolTypeError(
            f"from_tensordict: expected a TensorDict, got {type(tensor_dict).__name__}"
        )
    _check_one_batch_dim("from_tensordict", num_batch_dims)
    if tensor_dict.batch_dims != 1:
        raise BatchSizeMismatchError(
            f"from_tensordict: the TensorDict has {tensor_dict.batch_dims} batch dimensions "
            f"{list(tensor_dict.batch_size)}; a DataProto has one, its rows (set the "
            "TensorDict's batch_size to [rows])"
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
    return batch, non_tensors, meta


def columns_to_tensordict(
    rows: int,
    batch: TensorDictBase | None,
    non_tensor: Mapping[str, NDArray],
    meta: Mapping[str, Any],
) -> TensorDict:
    """``DataProto.to_tensordict``: one TensorDict of ``rows`` rows in verl's layout (tensor
    columns shared, numpy columns as ``NonTensorStack``, ``meta`` as ``NonTensorData``)."""
    if batch is not None:
        td: TensorDict = TensorDict(
            dict(batch.items()), batch_size=batch.batch_size, device=batch.device
        )
    else:
        td = TensorDict({}, batch_size=[rows])
    taken = {str(k) for k in td.keys()}  # noqa: SIM118 - a TensorDict, not a dict
    for key, column in non_tensor.items():
        if key in taken:
            raise KeyConflictError(
                f"DataProto.to_tensordict: {key!r} is both a tensor and a non-tensor column"
            )
        td.set(key, NonTensorStack(*[NonTensorData(v) for v in list(column)]))
        taken.add(key)
    for key, value in meta.items():
        if key in taken:
            raise KeyConflictError(
                f"DataProto.to_tensordict: meta_info key {key!r} is also a column name"
            )
        td.set_non_tensor(key, value)
    return td
