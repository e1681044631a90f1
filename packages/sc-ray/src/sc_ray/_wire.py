"""TensorDicts on the wire: only a shard's own rows travel.

Ray pickles a ``TensorDict`` the way torch pickles its tensors, which writes the whole
storage a view looks into: the shard of a 10000-row TensorDict split over four ranks would
carry all 10000 rows to each rank. sc-protocol's TensorDict state writes each tensor's own
elements, out of band and without a copy (the same path a ``DataProto`` takes), so sc-ray
registers it as Ray's serializer for ``TensorDict`` -- in the driver before it puts one, and
in a worker before it returns one. Importing sc_ray alone imports neither torch nor
tensordict: nothing happens until a TensorDict is about to travel.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

from . import _ray_api as rapi

__all__ = ["ensure_tensordict_wire", "is_data_proto", "is_tensordict"]

_lock = threading.Lock()
_registered = threading.Event()


def is_tensordict(value: object) -> bool:
    """Whether ``value`` is a TensorDict (tensordict need not be imported: if it is not,
    nothing in this process is one)."""
    module = sys.modules.get("tensordict")
    base: Any = getattr(module, "TensorDictBase", None) if module is not None else None
    return base is not None and isinstance(value, base)


def is_data_proto(value: object) -> bool:
    """Whether ``value`` is an sc-protocol ``DataProto`` (sc-protocol need not be imported:
    if it is not, nothing in this process is one)."""
    module = sys.modules.get("sc_protocol")
    cls: Any = getattr(module, "DataProto", None) if module is not None else None
    return cls is not None and isinstance(value, cls)


def ensure_tensordict_wire() -> None:
    """Register sc-protocol's TensorDict state as Ray's serializer in this process (once)."""
    if _registered.is_set():
        return
    with _lock:
        if _registered.is_set():
            return
        from sc_protocol.ext import rebuild_tensordict, tensordict_state
        from tensordict import TensorDict

        rapi.register_serializer(
            TensorDict,
            functools.partial(tensordict_state, protocol=5),
            rebuild_tensordict,
        )
        _registered.set()
