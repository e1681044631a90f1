"""``collate_fn``: rows (:class:`DataProtoItem`) stacked back into one DataProto."""

from __future__ import annotations

from collections.abc import Sequence

from tensordict import TensorDictBase

from ._columns import _stack_td, _stack_values
from ._data_proto import DataProto
from ._errors import InvalidSizeError, KeyMismatchError
from ._item import DataProtoItem

__all__ = ["collate_fn"]


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
