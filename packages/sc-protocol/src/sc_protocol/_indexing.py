"""Indexing a :class:`~sc_protocol.DataProto`: one row (a DataProtoItem), a slice (views) or
the rows at a list of positions or a boolean mask (functions; ``DataProto.__getitem__``,
``slice`` and ``select_idxs`` call them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from ._columns import IndexLike, _index_arrays
from ._errors import IndexOutOfRangeError, InvalidSizeError, ProtocolTypeError
from ._item import DataProtoItem

if TYPE_CHECKING:
    from ._data_proto import DataProto

__all__ = ["get_item", "select_idxs", "slice_rows"]

D = TypeVar("D", bound="DataProto")


def get_item(data: D, item: Any) -> D | DataProtoItem:
    """``data[item]``: see ``DataProto.__getitem__``."""
    if isinstance(item, slice):
        return slice_rows(data, item.start, item.stop, item.step)
    if isinstance(item, (bool, np.bool_)):
        raise ProtocolTypeError(f"DataProto index must not be a bool, got {item!r}")
    if isinstance(item, (int, np.integer)):
        n = len(data)
        i = int(item)
        if i < -n or i >= n:
            raise IndexOutOfRangeError(f"DataProto index {i} is out of range for {n} rows")
        i %= n
        return DataProtoItem(
            batch=None if data.batch is None else data.batch[i],
            non_tensor_batch={k: v[i] for k, v in data.non_tensor_batch.items()},
            meta_info=dict(data.meta_info),
        )
    if isinstance(item, (list, tuple, range, np.ndarray, torch.Tensor)):
        return select_idxs(data, item)
    raise ProtocolTypeError(
        f"DataProto index must be an int, a slice, a list/array/tensor of indices or a "
        f"boolean mask, got {type(item).__name__}"
    )


def slice_rows(data: D, start: int | None, end: int | None, step: int | None) -> D:
    """Rows ``start:end:step``: see ``DataProto.slice``."""
    for name, value in (("start", start), ("end", end), ("step", step)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ProtocolTypeError(
                f"DataProto.slice: {name} must be an int or None, got {value!r}"
            )
    sl = slice(start, end, step)
    if step == 0:
        raise InvalidSizeError("DataProto.slice: step must not be zero")
    if step is not None and step < 0:
        return select_idxs(data, np.arange(len(data), dtype=np.int64)[sl])
    batch = None if data.batch is None else data.batch[sl]
    non_tensor = {k: v[sl] for k, v in data.non_tensor_batch.items()}
    return data._new(batch, non_tensor)


def select_idxs(data: D, idxs: IndexLike) -> D:
    """Rows at ``idxs``: see ``DataProto.select_idxs``."""
    positions, positions_t = _index_arrays(idxs, len(data), "DataProto.select_idxs")
    batch = None
    if data.batch is not None:
        index = positions_t
        if data.batch.device is not None and data.batch.device.type != "cpu":
            index = positions_t.to(data.batch.device)
        batch = data.batch[index]
    non_tensor = {k: v[positions] for k, v in data.non_tensor_batch.items()}
    return data._new(batch, non_tensor)
