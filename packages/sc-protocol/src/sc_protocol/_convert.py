"""Conversions of :class:`~sc_protocol.DataProto` from and to plain containers: dicts of
tensors and numpy columns, and TensorDicts in verl's layout (functions; the DataProto
methods of the same names call them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from ._columns import NDArray, _stack_values
from ._config import DataProtoConfig
from ._errors import BatchSizeMismatchError, InvalidSizeError, KeyConflictError, ProtocolTypeError

if TYPE_CHECKING:
    from ._data_proto import DataProto

__all__ = ["from_dict", "from_single_dict", "from_tensordict", "to_tensordict"]

D = TypeVar("D", bound="DataProto")


def _check_one_batch_dim(where: str, num_batch_dims: object) -> None:
    # verl's signature keeps the parameter, and verl refuses any value but 1 (an assertion).
    if type(num_batch_dims) is not int or num_batch_dims != 1:
        raise InvalidSizeError(
            f"{where}: num_batch_dims must be 1 (a DataProto has one batch dimension, its "
            f"rows), got {num_batch_dims!r}"
        )


def from_dict(
    cls: type[D],
    tensors: Mapping[str, torch.Tensor] | None = None,
    non_tensors: Mapping[str, Any] | None = None,
    meta_info: Mapping[str, Any] | None = None,
    num_batch_dims: int = 1,
    auto_padding: bool = False,
) -> D:
    """Build from a dict of tensors, a dict of numpy columns (or lists) and ``meta_info``.

    The batch size is the first dimension of the tensors, which must all agree
    (``num_batch_dims`` is verl's parameter: any value but 1 is an
    :class:`~sc_protocol.InvalidSizeError`). ``auto_padding=True`` sets the per-object
    padding flag in ``meta_info``.
    """
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
    return cls(batch=batch, non_tensor_batch=dict(non_tensors or {}), meta_info=meta)


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
    return from_dict(cls, tensors, non_tensors, meta_info, auto_padding=auto_padding)


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
    return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)


def to_tensordict(self: DataProto) -> TensorDict:
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
