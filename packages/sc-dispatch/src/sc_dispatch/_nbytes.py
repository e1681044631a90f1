"""Payload byte estimates: roughly how many bytes a call argument carries.

A backend reports the bytes a call moves (call spans, decisions such as putting a large
argument into an object store once) without knowing the types it carries: it asks
:func:`payload_nbytes`. The answer comes from, in order,

1. for ``type(obj)``, then each of its base classes in method resolution order: a hook
   registered for that class with :func:`register_nbytes` (for types that are not shardable,
   such as tensors and arrays: sc-protocol registers ``torch.Tensor`` and ``numpy.ndarray``),
   else the ``nbytes(obj)`` method of the shard adapter registered for that class, if the
   adapter has one (an optional part of the :class:`~sc_dispatch.ext.ShardAdapter` protocol,
   spelled out by :class:`~sc_dispatch.ext.SizedShardAdapter`);
2. ``bytes`` and ``bytearray`` (their length) and ``memoryview`` (its ``nbytes``);
3. lists, tuples and mappings: the sum over their items (a mapping's values), down to a
   bounded depth; a container scans at most its first ``MAX_ITEMS`` (10,000) items and
   scales their sum up to its length;
4. anything else weighs 0.

Nothing is copied or serialized, and this module imports the standard library only.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from ._errors import DispatchArgumentError, NotShardableError
from ._shard import adapter_for_class

__all__ = [
    "MAX_ITEMS",
    "NbytesFn",
    "get_nbytes_fn",
    "payload_nbytes",
    "register_nbytes",
]

T = TypeVar("T")

#: ``nbytes(obj)``: the payload bytes of ``obj``, a non-negative int, computed without copying.
NbytesFn = Callable[[Any], int]

#: The most items of one list, tuple or mapping that :func:`payload_nbytes` looks at.
MAX_ITEMS = 10_000

_DEFAULT_DEPTH = 4
_WEIGHTLESS = frozenset({type(None), bool, int, float, complex, str})

_lock = threading.Lock()
_hooks: dict[type, NbytesFn] = {}


def register_nbytes(cls: type[T], nbytes: Callable[[T], int]) -> None:
    """Teach :func:`payload_nbytes` the size of instances of ``cls`` (and its subclasses),
    without making ``cls`` shardable. Registering a type again replaces its hook; a hook
    takes precedence over the ``nbytes`` of a shard adapter registered for the same class.
    """
    if not isinstance(cls, type):
        raise NotShardableError(
            f"register_nbytes: expected a class, got {type(cls).__qualname__} {cls!r}"
        )
    if not callable(nbytes):
        raise NotShardableError(
            f"register_nbytes: the hook for {cls.__qualname__} must be callable, got {nbytes!r}"
        )
    with _lock:
        _hooks[cls] = nbytes


def get_nbytes_fn(obj: object) -> NbytesFn | None:
    """The size function :func:`payload_nbytes` uses for ``obj``: the hook or adapter
    ``nbytes`` of ``type(obj)`` or of its nearest base class that has one, else ``None``."""
    for klass in type(obj).__mro__:
        hook = _hooks.get(klass)
        if hook is not None:
            return hook
        adapter = adapter_for_class(klass)
        if adapter is not None:
            method = getattr(adapter, "nbytes", None)
            if callable(method):
                found: NbytesFn = method
                return found
    return None


def payload_nbytes(obj: object, *, max_depth: int = _DEFAULT_DEPTH) -> int:
    """Roughly the payload bytes of ``obj`` (see the module docstring for the rules);
    ``max_depth`` bounds how many levels of lists, tuples and mappings are entered."""
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise DispatchArgumentError(
            f"payload_nbytes: max_depth must be a non-negative int, got {max_depth!r}"
        )
    return _nbytes(obj, max_depth)


def _nbytes(obj: object, depth: int) -> int:
    kind = type(obj)
    if kind in _WEIGHTLESS:
        return 0
    fn = get_nbytes_fn(obj)
    if fn is not None:
        size = fn(obj)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise DispatchArgumentError(
                f"payload_nbytes: the nbytes of {kind.__qualname__} returned {size!r}, "
                "not a non-negative int"
            )
        return size
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if isinstance(obj, memoryview):
        return obj.nbytes
    if depth == 0:
        return 0
    if isinstance(obj, (list, tuple)):
        return _sum_items(obj, len(obj), depth - 1)
    if isinstance(obj, Mapping):
        return _sum_items(obj.values(), len(obj), depth - 1)
    return 0


def _sum_items(items: Iterable[object], length: int, depth: int) -> int:
    total = sum(_nbytes(item, depth) for item in itertools.islice(items, MAX_ITEMS))
    if length > MAX_ITEMS:
        total = total * length // MAX_ITEMS
    return total
