"""Importing tensordict without importing ``torch._dynamo`` with it.

When it is imported, tensordict marks a few of its functions for ``torch.compile``: it calls
``torch.compiler.allow_in_graph`` and ``torch.compiler.assume_constant_result``, and each of
those imports ``torch._dynamo`` first -- and with it sympy and most of ``torch._inductor``.
That is more CPU time than importing torch itself (docs/performance.md, "Worker start-up"),
paid by every worker process that handles a DataProto, even one that never compiles.

sc-protocol therefore imports tensordict, the first time, with those two functions replaced:

* ``assume_constant_result(fn)`` does what Dynamo's own does: it sets the attribute
  ``fn._dynamo_marked_constant`` and returns ``fn``;
* ``allow_in_graph(fn)`` records ``fn`` and returns it, as Dynamo's does. The recorded
  functions are handed to the real ``allow_in_graph`` as soon as anything imports
  ``torch._dynamo`` (a one-shot import hook, which removes itself), so that a later
  ``torch.compile`` treats them exactly as tensordict asked.

The originals are put back as soon as tensordict is imported. Nothing is replaced when
tensordict or ``torch._dynamo`` is already imported, or when the environment variable
``SC_PROTOCOL_EAGER_DYNAMO`` is true: tensordict is then imported as it is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch.compiler

from ._settings import EAGER_DYNAMO

__all__ = ["import_tensordict", "pending_allow_in_graph"]

_log = logging.getLogger(__name__)

_DYNAMO = "torch._dynamo"
_lock = threading.Lock()  # guards _pending and the hook; held only briefly
_import_lock = threading.Lock()  # one thread swaps torch.compiler's functions at a time
_pending: list[Callable[..., Any]] = []


def pending_allow_in_graph() -> tuple[Callable[..., Any], ...]:
    """The functions tensordict marked for ``torch.compile`` that wait for ``torch._dynamo``."""
    with _lock:
        return tuple(_pending)


def _flush(dynamo: ModuleType) -> None:
    """Hand the recorded functions to Dynamo's own ``allow_in_graph``."""
    with _lock:
        waiting = list(_pending)
        _pending.clear()
    for fn in waiting:
        try:
            dynamo.allow_in_graph(fn)
        except Exception:  # the import of torch._dynamo must not fail because of one of them
            _log.warning(
                "sc_protocol: torch._dynamo.allow_in_graph(%r), deferred from the import of "
                "tensordict, failed; torch.compile may trace into it",
                fn,
                exc_info=True,
            )


def _deferred_allow_in_graph(fn: Any) -> Any:
    dynamo = sys.modules.get(_DYNAMO)
    if dynamo is not None and hasattr(dynamo, "allow_in_graph"):
        return dynamo.allow_in_graph(fn)
    items = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    with _lock:
        _pending.extend(items)
    return items if isinstance(fn, (list, tuple)) else fn


def _deferred_assume_constant_result(fn: Any) -> Any:
    fn._dynamo_marked_constant = True
    return fn


class _FlushingLoader(importlib.abc.Loader):
    """The loader of ``torch._dynamo``, which flushes the recorded functions once it ran."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _flush(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, resource readers...
        return getattr(self._inner, name)


class _DynamoImportHook(importlib.abc.MetaPathFinder):
    """Finds ``torch._dynamo`` through the other finders and wraps its loader (once)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _DYNAMO:
            return None
        _remove_hook()
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = (
                find(fullname, path, target) if find is not None else None
            )
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _FlushingLoader(spec.loader)
                return spec
        return None


_hook = _DynamoImportHook()


def _remove_hook() -> None:
    with _lock:
        if _hook in sys.meta_path:
            sys.meta_path.remove(_hook)


def _install_hook() -> None:
    with _lock:
        if _hook not in sys.meta_path:
            sys.meta_path.insert(0, _hook)


def import_tensordict() -> ModuleType:
    """Import tensordict (once per process), deferring its ``torch.compile`` marks."""
    if "tensordict" in sys.modules or _DYNAMO in sys.modules or EAGER_DYNAMO.get():
        return importlib.import_module("tensordict")
    compiler: Any = torch.compiler
    with _import_lock:
        if "tensordict" in sys.modules:  # another thread imported it meanwhile
            return importlib.import_module("tensordict")
        saved = (compiler.allow_in_graph, compiler.assume_constant_result)
        compiler.allow_in_graph = _deferred_allow_in_graph
        compiler.assume_constant_result = _deferred_assume_constant_result
        try:
            module = importlib.import_module("tensordict")
        finally:
            compiler.allow_in_graph, compiler.assume_constant_result = saved
        if pending_allow_in_graph():
            _install_hook()
    dynamo = sys.modules.get(_DYNAMO)  # imported meanwhile, by another thread or tensordict
    if dynamo is not None and hasattr(dynamo, "allow_in_graph"):
        _remove_hook()
        _flush(dynamo)
    return module


import_tensordict()
