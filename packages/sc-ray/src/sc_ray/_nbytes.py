"""What is worth putting into the object store once, and roughly how many bytes it holds.

Types are told apart with ``isinstance`` against the classes of modules already loaded in
this process (``sys.modules``): a process that never imported torch holds no tensor, so
``import sc_ray`` imports neither torch, numpy nor sc-protocol. Byte counts (for call spans)
come from sc-dispatch's registry (:func:`sc_dispatch.ext.payload_nbytes`): no type names are
inspected.
"""

from __future__ import annotations

import sys
from typing import Any

from sc_dispatch.ext import payload_nbytes

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


def estimate_nbytes(obj: object) -> int:
    """Roughly the payload bytes of ``obj`` (tensors, arrays, DataProtos, TensorDicts, bytes
    and containers of them; 0 for anything else), from sc-dispatch's registry, which
    sc-protocol fills when it is imported (a process holding a DataProto has)."""
    return payload_nbytes(obj)


def is_bulk(obj: object) -> bool:
    """Whether ``obj`` is worth putting into the object store once and passing by reference:
    DataProtos, tensors, arrays, TensorDicts and large bytes."""
    if isinstance(obj, (bytes, bytearray)):
        return len(obj) >= INLINE_LIMIT
    arrays = _array_types()
    return (bool(arrays) and isinstance(obj, arrays)) or is_data_proto(obj) or is_tensordict(obj)
