"""Padding a batch to a multiple of a size, and dropping the padding again."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from ._data_proto import DataProto
from ._errors import InvalidSizeError, ProtocolTypeError

__all__ = ["pad_dataproto_to_divisor", "unpad_dataproto"]

D = TypeVar("D", bound="DataProto")


def pad_dataproto_to_divisor(data: D, size_divisor: int) -> tuple[D, int]:
    """Pad ``data`` (on a new object) to a multiple of ``size_divisor`` rows.

    The padding repeats rows from the start, cycling if needed. Returns the padded batch and
    the number of rows added; ``data`` itself is never changed.
    """
    if not isinstance(data, DataProto):
        raise ProtocolTypeError(
            f"pad_dataproto_to_divisor: expected a DataProto, got {type(data).__name__}"
        )
    if isinstance(size_divisor, bool) or not isinstance(size_divisor, int) or size_divisor < 1:
        raise InvalidSizeError(
            f"pad_dataproto_to_divisor: size_divisor must be a positive int, got {size_divisor!r}"
        )
    n = len(data)
    pad_size = (-n) % size_divisor
    if pad_size == 0:
        return data, 0
    if n == 0:
        raise InvalidSizeError(
            f"pad_dataproto_to_divisor: cannot pad an empty batch to a multiple of {size_divisor}"
        )
    return data._append_rows(np.arange(pad_size, dtype=np.int64) % n), pad_size


def unpad_dataproto(data: D, pad_size: int) -> D:
    """Drop the last ``pad_size`` rows (a view; ``data`` itself is unchanged)."""
    if isinstance(pad_size, bool) or not isinstance(pad_size, int) or pad_size < 0:
        raise InvalidSizeError(
            f"unpad_dataproto: pad_size must be a non-negative int, got {pad_size!r}"
        )
    if pad_size > len(data):
        raise InvalidSizeError(
            f"unpad_dataproto: cannot drop {pad_size} padding rows from a batch of {len(data)}"
        )
    if pad_size == 0:
        return data
    return data.slice(0, len(data) - pad_size)
