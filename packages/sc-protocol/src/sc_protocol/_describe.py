"""What a :class:`~sc_protocol.DataProto` holds, for people and for schedulers: a column
listing, its size in bytes (tensor elements and numpy buffers, counted without copying), and
verl's ``print_size`` log line."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from ._columns import _key_str, _leaves, _tensor_nbytes

if TYPE_CHECKING:
    from tensordict import TensorDictBase

    from ._data_proto import DataProto

__all__ = ["data_proto_nbytes", "get_data_info", "print_size", "tensordict_nbytes"]

logger = logging.getLogger("sc_protocol")


def tensordict_nbytes(td: TensorDictBase) -> int:
    """The bytes of the elements of every tensor leaf of ``td`` (``numel * element_size``;
    the rest of a storage that a view looks into is not counted)."""
    return sum(_tensor_nbytes(v) for _, v in _leaves(td) if isinstance(v, torch.Tensor))


def _numpy_nbytes(data: DataProto) -> int:
    return sum(int(v.nbytes) for v in data.non_tensor_batch.values())


def data_proto_nbytes(data: DataProto) -> int:
    """The payload bytes of ``data``: its tensor leaves (:func:`tensordict_nbytes`) plus the
    ``nbytes`` of its numpy columns (an object column counts its pointers, not the objects);
    ``meta_info`` is not counted."""
    tensor_bytes = 0 if data.batch is None else tensordict_nbytes(data.batch)
    return tensor_bytes + _numpy_nbytes(data)


def get_data_info(data: DataProto) -> str:
    """A multi-line description of every column: key, shape, dtype, device."""
    lines = [f"{type(data).__name__} with {len(data)} rows"]
    lines.append("batch:")
    if data.batch is None:
        lines.append("  (none)")
    else:
        for key, value in _leaves(data.batch):
            if isinstance(value, torch.Tensor):
                lines.append(
                    f"  {_key_str(key)}: shape={tuple(value.shape)}, dtype={value.dtype}, "
                    f"device={value.device}"
                )
            else:
                lines.append(f"  {_key_str(key)}: {type(value).__name__}")
    lines.append("non_tensor_batch:")
    if not data.non_tensor_batch:
        lines.append("  (none)")
    for key, arr in data.non_tensor_batch.items():
        lines.append(f"  {key!r}: shape={arr.shape}, dtype={arr.dtype}")
    lines.append(f"meta_info: {sorted(data.meta_info)}")
    return "\n".join(lines)


def print_size(data: DataProto, prefix: str = "") -> str:
    """Log (at INFO, logger ``sc_protocol``) and return the size of the batch in GiB."""
    tensor_bytes = 0 if data.batch is None else tensordict_nbytes(data.batch)
    numpy_bytes = _numpy_nbytes(data)
    message = (
        f"{prefix}size of tensordict: {tensor_bytes / 2**30:.6f} GB, "
        f"size of non_tensor_batch: {numpy_bytes / 2**30:.6f} GB"
    )
    logger.info(message)
    return message
