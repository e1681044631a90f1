"""What is worth putting into the object store once, and roughly how many bytes it holds.

Types are told apart with ``isinstance`` against the classes of modules already loaded in
this process (``sys.modules``): a process that never imported torch holds no tensor, so
``import sc_ray`` imports neither torch, numpy nor sc-protocol. Byte counts of containers a
shard adapter knows (a DataProto) come from sc-dispatch's adapter registry
(:func:`sc_dispatch.payload_nbytes`), falling back to the loaded array types here.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ._wire import is_data_proto, is_tensordict

__all__ = ["INLINE_LIMIT", "estimate_nbytes", "is_bulk"]

#: Plain bytes objects at least this large are put into the object store once per call.
INLINE_LIMIT = 100 * 1024


def _array_types() -> tuple[type, ...]:
    """``torch.Tensor`` and ``numpy.ndarray``, if those modules are loaded."""
    found: list[type] = []
    torch: Any = sys.modules.get("torch")
    if torch is not None and isinstance(getattr(torch, "Tensor", None), type):
        found.append(torch.Tensor)
    numpy: Any = sys.modules.get("numpy")
    if numpy is not None and isinstance(getattr(numpy, "ndarray", None), type):
        found.append(numpy.ndarray)
    return tuple(found)


def _array_bytes(value: Any) -> int:
    n = getattr(value, "nbytes", None)
    if isinstance(n, int):
        return n
    return int(value.numel()) * int(value.element_size())


def estimate_nbytes(obj: object, _depth: int = 0) -> int:
    """Roughly the payload bytes of ``obj``: tensors, arrays, DataProtos, TensorDicts, bytes
    and containers of them (0 for anything else)."""
    if _depth > 4 or obj is None:
        return 0
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    arrays = _array_types()
    if arrays and isinstance(obj, arrays):
        return _array_bytes(obj)
    if is_data_proto(obj):
        batch: Any = getattr(obj, "batch", None)
        extra = getattr(obj, "non_tensor_batch", None)
        total = estimate_nbytes(batch, _depth + 1) if batch is not None else 0
        if isinstance(extra, Mapping):
            total += sum(estimate_nbytes(v, _depth + 1) for v in extra.values())
        return total
    if is_tensordict(obj):
        leaves: Any = obj.values(include_nested=True, leaves_only=True)  # type: ignore[attr-defined]  # a TensorDict
        return sum(_array_bytes(leaf) for leaf in leaves)
    if isinstance(obj, (list, tuple)):
        return sum(estimate_nbytes(v, _depth + 1) for v in obj[:1000])
    if isinstance(obj, Mapping):
        return sum(estimate_nbytes(v, _depth + 1) for v in list(obj.values())[:1000])
    return 0


def is_bulk(obj: object) -> bool:
    """Whether ``obj`` is worth putting into the object store once and passing by reference:
    DataProtos, tensors, arrays, TensorDicts and large bytes."""
    if isinstance(obj, (bytes, bytearray)):
        return len(obj) >= INLINE_LIMIT
    arrays = _array_types()
    return (bool(arrays) and isinstance(obj, arrays)) or is_data_proto(obj) or is_tensordict(obj)
