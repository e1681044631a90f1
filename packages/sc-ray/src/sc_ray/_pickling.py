"""Make sc-core's context variables picklable by reference.

Ray ships a dynamically built class (sc-core's colocated and fused worker classes) by value
with cloudpickle, together with the module globals its methods use. sc-core's
``_skip_rendezvous`` is such a global and a ``contextvars.ContextVar``, which cannot be
pickled. This reducer sends the *name* of a ContextVar defined in an sc-core module instead,
and the worker looks the same variable up in its own import of that module. Other
ContextVars still fail to pickle, exactly as before.

(Workaround until sc-core's colocation code refers to the variable through its module.)
"""

from __future__ import annotations

import contextvars
import copyreg
import importlib
import sys
from typing import Any

__all__ = ["install"]

_MODULES = ("sc_core._context", "sc_core._colocate", "sc_core._worker_group")


def _lookup(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def _reduce(var: contextvars.ContextVar[Any]) -> tuple[Any, tuple[str, str]]:
    for module_name in _MODULES:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name, value in vars(module).items():
            if value is var:
                return _lookup, (module_name, name)
    raise TypeError(f"cannot pickle {var!r} (a ContextVar outside sc-core)")


def install() -> None:
    """Register the reducer (idempotent)."""
    copyreg.pickle(contextvars.ContextVar, _reduce)
