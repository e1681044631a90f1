"""``DataProtoItem``: one row of a DataProto (``collate_fn`` in :mod:`._collate` stacks rows
back into one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tensordict import TensorDictBase

from ._serialize import batch_pickle_state, rebuild_tensordict

__all__ = ["DataProtoItem"]


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
        batch = batch_pickle_state(self.batch, self.meta_info, protocol, "DataProtoItem pickling")
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
