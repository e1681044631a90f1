"""What plain columns (a batch TensorDict or ``None`` and a dict of numpy columns) hold, for
people and for schedulers: a column listing, their size in bytes (tensor elements and numpy
buffers, counted without copying), and verl's ``print_size`` log line. DataProto's
``get_data_info`` and ``print_size`` and the shard adapters' sizes call these."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase

from ._columns import NDArray, _key_str, _leaves, _tensor_nbytes

__all__ = ["columns_nbytes", "describe_columns", "size_message", "tensordict_nbytes"]

logger = logging.getLogger("sc_protocol")


def tensordict_nbytes(td: TensorDictBase) -> int:
    """The bytes of the elements of every tensor leaf of ``td`` (``numel * element_size``;
    the rest of a storage that a view looks into is not counted)."""
    return sum(_tensor_nbytes(v) for _, v in _leaves(td) if isinstance(v, torch.Tensor))


def _numpy_nbytes(non_tensor: Mapping[str, NDArray]) -> int:
    return sum(int(v.nbytes) for v in non_tensor.values())


def columns_nbytes(batch: TensorDictBase | None, non_tensor: Mapping[str, NDArray]) -> int:
    """The payload bytes of a batch: its tensor leaves (:func:`tensordict_nbytes`) plus the
    ``nbytes`` of its numpy columns (an object column counts its pointers, not the
    objects); ``meta_info`` is not counted."""
    tensor_bytes = 0 if batch is None else tensordict_nbytes(batch)
    return tensor_bytes + _numpy_nbytes(non_tensor)


def describe_columns(
    batch: TensorDictBase | None, non_tensor: Mapping[str, NDArray], meta: Mapping[str, Any]
) -> list[str]:
    """One line per column (key, shape, dtype, device), under ``batch:`` and
    ``non_tensor_batch:``, and the ``meta`` keys."""
    lines = ["batch:"]
    if batch is None:
        lines.append("  (none)")
    else:
        for key, value in _leaves(batch):
            if isinstance(value, torch.Tensor):
                lines.append(
                    f"  {_key_str(key)}: shape={tuple(value.shape)}, dtype={value.dtype}, "
                    f"device={value.device}"
                )
            else:
                lines.append(f"  {_key_str(key)}: {type(value).__name__}")
    lines.append("non_tensor_batch:")
    if not non_tensor:
        lines.append("  (none)")
    for key, arr in non_tensor.items():
        lines.append(f"  {key!r}: shape={arr.shape}, dtype={arr.dtype}")
    lines.append(f"meta_info: {sorted(meta)}")
    return lines


def size_message(
    batch: TensorDictBase | None, non_tensor: Mapping[str, NDArray], prefix: str
) -> str:
    """Log (at INFO, logger ``sc_protocol``) and return the sizes in GiB of the tensor
    columns and of the numpy columns."""
    tensor_bytes = 0 if batch is None else tensordict_nbytes(batch)
    numpy_bytes = _numpy_nbytes(non_tensor)
    message = (
        f"{prefix}size of tensordict: {tensor_bytes / 2**30:.6f} GB, "
        f"size of non_tensor_batch: {numpy_bytes / 2**30:.6f} GB"
    )
    logger.info(message)
    return message
