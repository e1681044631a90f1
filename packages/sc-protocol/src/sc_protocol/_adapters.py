"""The shard adapters that let sc-dispatch split, join, pad and size DataProto, TensorDict
and DataProtoFuture, and the byte-size hooks for tensors and numpy arrays; registered when
:mod:`sc_protocol` is imported, so that :func:`sc_dispatch.ext.payload_nbytes` sizes any call
argument that holds them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from sc_dispatch.ext import chunk_sizes, register_future_type, register_nbytes, register_shardable
from tensordict import TensorDict, TensorDictBase

from ._columns import _tensor_nbytes, cat_tensordicts
from ._config import DataProtoConfig
from ._data_proto import DataProto
from ._describe import columns_nbytes, tensordict_nbytes
from ._errors import BatchSizeMismatchError, InvalidSizeError
from ._future import DataProtoFuture
from ._item import DataProtoItem
from ._padding import unpad_dataproto

__all__ = [
    "DataProtoAdapter",
    "DataProtoFutureAdapter",
    "TensorDictAdapter",
    "register_adapters",
]


class DataProtoAdapter:
    """DataProto rows: chunks are views, padding repeats rows from the start on a new object;
    the metadata-only form keeps the row count and ``meta_info``, no columns."""

    def length(self, obj: DataProto) -> int:
        return len(obj)

    def chunk(self, obj: DataProto, chunks: int) -> list[DataProto]:
        # The adapter contract: ``numpy.array_split`` sizes. ``DataProto.chunk`` is exact
        # (verl's rule, for users); a splitting mode pads or refuses before it gets here,
        # while the load-balanced mode cuts micro-shards that may differ by one row.
        return obj._split_sizes(chunk_sizes(len(obj), chunks))

    def concat(self, parts: Sequence[DataProto]) -> DataProto:
        return DataProto.concat(list(parts))

    def pad(self, obj: DataProto, pad_size: int) -> DataProto:
        if pad_size == 0:
            return obj
        n = len(obj)
        if n == 0:
            raise InvalidSizeError(f"cannot pad an empty DataProto with {pad_size} rows")
        return obj._append_rows(np.arange(pad_size, dtype=np.int64) % n)

    def unpad(self, obj: DataProto, pad_size: int) -> DataProto:
        return unpad_dataproto(obj, pad_size)

    def auto_padding(self, obj: DataProto) -> bool:
        return obj.is_padding_enabled()

    def take(self, obj: DataProto, positions: Sequence[int]) -> DataProto:
        """The rows at ``positions``, in that order (a new object)."""
        return obj.select_idxs(np.asarray(positions, dtype=np.int64))

    def nbytes(self, obj: DataProto) -> int:
        """Tensor elements of every leaf plus the ``nbytes`` of every numpy column."""
        return columns_nbytes(obj.batch, obj.non_tensor_batch)

    def metadata_only(self, obj: DataProto) -> DataProto:
        """What a rank that does not read the batch receives (a middle pipeline stage on a
        mesh registered with ``receives_data=False``): a DataProto of the same class, row
        count and ``meta_info`` (a shallow copy), whose batch is a TensorDict of
        ``batch_size [n]`` with no keys and which has no numpy columns."""
        return obj._new(TensorDict({}, batch_size=[len(obj)]), {})


def _td_rows(td: TensorDictBase) -> int:
    if td.batch_dims < 1:
        raise BatchSizeMismatchError(
            "a TensorDict with batch_size=[] has no rows to split; give it a batch dimension"
        )
    return int(td.batch_size[0])


class TensorDictAdapter:
    """Plain TensorDicts (nested / jagged tensors included), split along dimension 0."""

    def length(self, obj: TensorDictBase) -> int:
        return _td_rows(obj)

    def chunk(self, obj: TensorDictBase, chunks: int) -> list[TensorDictBase]:
        return list(obj.split(chunk_sizes(_td_rows(obj), chunks), dim=0))

    def concat(self, parts: Sequence[TensorDictBase]) -> TensorDictBase:
        if not parts:
            raise InvalidSizeError("cannot concatenate an empty list of TensorDicts")
        if len(parts) == 1:
            return parts[0]
        return cat_tensordicts(parts)

    def pad(self, obj: TensorDictBase, pad_size: int) -> TensorDictBase:
        if pad_size == 0:
            return obj
        n = _td_rows(obj)
        if n == 0:
            raise InvalidSizeError(f"cannot pad an empty TensorDict with {pad_size} rows")
        extra = obj[torch.arange(pad_size) % n]
        return cat_tensordicts([obj, extra])

    def unpad(self, obj: TensorDictBase, pad_size: int) -> TensorDictBase:
        n = _td_rows(obj)
        if pad_size > n:
            raise InvalidSizeError(f"cannot drop {pad_size} padding rows from a TensorDict of {n}")
        out: TensorDictBase = obj[: n - pad_size]
        return out

    def auto_padding(self, obj: TensorDictBase) -> bool:
        return bool(DataProtoConfig.auto_padding)

    def take(self, obj: TensorDictBase, positions: Sequence[int]) -> TensorDictBase:
        """The rows at ``positions``, in that order."""
        out: TensorDictBase = obj[torch.as_tensor(list(positions), dtype=torch.long)]
        return out

    def nbytes(self, obj: TensorDictBase) -> int:
        """Tensor elements of every leaf (``numel * element_size``)."""
        return tensordict_nbytes(obj)


class DataProtoFutureAdapter:
    """Futures: every operation is lazy; the length is ``None`` until row counts are known."""

    def length(self, obj: DataProtoFuture) -> int | None:
        return obj.num_rows

    def chunk(self, obj: DataProtoFuture, chunks: int) -> list[DataProtoFuture]:
        return obj.chunk(chunks)

    def concat(self, parts: Sequence[DataProtoFuture]) -> DataProtoFuture:
        return DataProtoFuture.concat(list(parts))

    def pad(self, obj: DataProtoFuture, pad_size: int) -> DataProtoFuture:
        return obj.pad(pad_size)

    def unpad(self, obj: DataProtoFuture, pad_size: int) -> DataProtoFuture:
        return obj.unpad(pad_size)

    def auto_padding(self, obj: DataProtoFuture) -> bool:
        return bool(DataProtoConfig.auto_padding)

    def nbytes(self, obj: DataProtoFuture) -> int:
        """0: the rows live wherever the producer left them, not in this handle."""
        return 0


def _array_nbytes(arr: np.ndarray[Any, Any]) -> int:
    return int(arr.nbytes)


def _item_nbytes(item: DataProtoItem) -> int:
    tensor_bytes = 0 if item.batch is None else tensordict_nbytes(item.batch)
    values = item.non_tensor_batch.values()
    return tensor_bytes + sum(
        int(v.nbytes) for v in values if isinstance(v, (np.ndarray, np.generic))
    )


def register_adapters() -> None:
    """Register the three adapters, the future type and the size hooks of ``torch.Tensor``
    (``numel * element_size``; a view counts its own elements only), ``numpy.ndarray``
    (``nbytes``) and :class:`DataProtoItem` (its tensors and numpy values) with sc-dispatch
    (idempotent)."""
    register_shardable(DataProto, DataProtoAdapter())
    register_shardable(cast("type[Any]", TensorDictBase), TensorDictAdapter())
    register_shardable(DataProtoFuture, DataProtoFutureAdapter())
    register_future_type(DataProtoFuture)
    register_nbytes(torch.Tensor, _tensor_nbytes)
    register_nbytes(np.ndarray, _array_nbytes)
    register_nbytes(DataProtoItem, _item_nbytes)
