"""Row operations a future records when some shard's row count is unknown.

Without known row counts a future cannot tell which shards it needs; ``slice``, ``chunk``,
``pad`` and ``unpad`` (and verl's ``dispatch_fn``) are then kept as *operations* and applied,
in order, to the joined value once every shard has been fetched -- verl's behaviour.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._data_proto import DataProto
from ._errors import FutureError, UnknownRowCountError
from ._padding import unpad_dataproto
from ._slices import chunk_bounds

__all__ = ["Op", "apply_op", "op_rows"]

#: ``(kind, a, b)``: ``("slice", start, stop)``, ``("chunk", index, chunks)``,
#: ``("pad", rows, None)``, ``("unpad", rows, None)`` or ``("fn", dispatch_fn, None)``.
Op = tuple[str, Any, Any]


def op_rows(op: Op, rows: int) -> int:
    """The rows after ``op`` is applied to ``rows`` rows (unknown for ``"fn"``)."""
    kind, a, b = op
    if kind == "slice":
        return max(0, min(int(b), rows) - min(int(a), rows))
    if kind == "chunk":
        lo, hi = chunk_bounds(rows, b)[a]
        return hi - lo
    if kind == "pad":
        return rows + int(a)
    if kind == "unpad":
        return max(0, rows - int(a))
    raise UnknownRowCountError(f"DataProtoFuture: the rows after {kind!r} are unknown")


def apply_op(op: Op, value: DataProto) -> DataProto:
    """``op`` applied to the resolved ``value``."""
    kind, a, b = op
    if kind == "fn":
        out = a(value)
        if not isinstance(out, DataProto):
            raise FutureError(
                f"DataProtoFuture: dispatch_fn returned a {type(out).__name__}, not a DataProto"
            )
        return out
    n = len(value)
    if kind == "slice":
        if b > n:
            raise FutureError(
                f"DataProtoFuture: row range {a}:{b} is not within the {n} rows that resolved"
            )
        return value.slice(a, b)
    if kind == "chunk":
        lo, hi = chunk_bounds(n, b)[a]
        return value.slice(lo, hi)
    if kind == "pad":
        if n == 0:
            raise FutureError(f"DataProtoFuture: cannot pad an empty result with {a} rows")
        return value._append_rows(np.arange(a, dtype=np.int64) % n)
    if kind == "unpad":
        if a > n:
            raise FutureError(f"DataProtoFuture: cannot drop {a} padding rows from {n} rows")
        return unpad_dataproto(value, a)
    raise FutureError(f"DataProtoFuture: unknown operation {kind!r}")
