"""``DataProtoItem``: one row of a DataProto, and ``collate_fn``, which stacks rows back."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tensordict import TensorDictBase

from ._columns import _stack_td, _stack_values
from ._errors import InvalidSizeError, KeyMismatchError
from ._serialize import check_picklable, rebuild_tensordict, tensordict_state

if TYPE_CHECKING:
    from ._data_proto import DataProto

__all__ = ["DataProtoItem", "collate_fn"]


@dataclass
class DataProtoItem:
    """One row of a DataProto: ``batch`` has an empty batch size, columns hold one entry.

    It pickles like a DataProto: only the row's own elements travel, never the storage of
    the batch it was taken from.
    """

    batch: TensorDictBase | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        proto = int(protocol) if isinstance(protocol, int) else pickle.DEFAULT_PROTOCOL
        check_picklable(self.meta_info, "DataProtoItem pickling")
        batch = None if self.batch is None else tensordict_state(self.batch, proto)
        return (_rebuild_item, (type(self), batch, self.non_tensor_batch, self.meta_info))


def _rebuild_item(
    cls: type[DataProtoItem],
    batch: Any,
    non_tensor_batch: dict[str, Any],
    meta_info: dict[str, Any],
) -> DataProtoItem:
    return cls(
        batch=None if batch is None else rebuild_tensordict(batch),
        non_tensor_batch=non_tensor_batch,
        meta_info=meta_info,
    )


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
    from ._data_proto import DataProto

    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(items[0].meta_info))
