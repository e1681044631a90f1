"""Byte estimates for call spans, without importing torch, numpy or sc-protocol."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._wire import is_tensordict

__all__ = ["estimate_nbytes", "is_bulk", "is_data_proto"]

_BULK_MODULES = ("sc_protocol", "torch", "numpy", "tensordict")
#: Plain bytes objects at least this large are put into the object store once per call.
INLINE_LIMIT = 100 * 1024


def is_data_proto(obj: object) -> bool:
    """Whether ``obj`` is an sc-protocol DataProto, told without importing sc-protocol."""
    kind = type(obj)
    return kind.__name__ == "DataProto" and kind.__module__.startswith("sc_protocol")


def _tensor_bytes(value: Any) -> int:
    n = getattr(value, "nbytes", None)
    if isinstance(n, int):
        return n
    try:
        return int(value.numel()) * int(value.element_size())
    except Exception:
        return 0


def estimate_nbytes(obj: object, _depth: int = 0) -> int:
    """Roughly the payload bytes of ``obj``: tensors, arrays, DataProtos, bytes, containers."""
    if _depth > 4 or obj is None:
        return 0
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if is_data_proto(obj):
        total = 0
        batch = getattr(obj, "batch", None)
        if batch is not None:
            try:
                for leaf in batch.values(include_nested=True, leaves_only=True):
                    total += _tensor_bytes(leaf)
            except Exception:
                total += 0
        extra = getattr(obj, "non_tensor_batch", None)
        if isinstance(extra, Mapping):
            total += sum(estimate_nbytes(v, _depth + 1) for v in extra.values())
        return total
    if is_tensordict(obj):
        try:
            leaves = obj.values(include_nested=True, leaves_only=True)  # type: ignore[attr-defined]  # a TensorDict
            return sum(_tensor_bytes(leaf) for leaf in leaves)
        except Exception:
            return 0
    if type(obj).__module__.startswith(("torch", "numpy")):
        return _tensor_bytes(obj)
    if isinstance(obj, (list, tuple)):
        return sum(estimate_nbytes(v, _depth + 1) for v in obj[:1000])
    if isinstance(obj, Mapping):
        return sum(estimate_nbytes(v, _depth + 1) for v in list(obj.values())[:1000])
    return 0


def is_bulk(obj: object) -> bool:
    """Whether ``obj`` is worth putting into the object store once and passing by reference:
    DataProtos, tensors, arrays, TensorDicts and large bytes (futures never are)."""
    if isinstance(obj, (bytes, bytearray)):
        return len(obj) >= INLINE_LIMIT
    kind = type(obj)
    if kind.__name__.endswith("Future"):
        return False
    return kind.__module__.startswith(_BULK_MODULES)
