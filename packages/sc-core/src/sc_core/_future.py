"""``LazyFuture``: the future type non-blocking calls return unless a backend has its own.

A ``LazyFuture`` wraps a function computing its value; the first :meth:`~LazyFuture.get`
runs it (once, even from several threads) and later calls return the same value or raise
the same exception. It is registered with sc-dispatch as a future type (so a worker method
receiving one as an argument gets its value) and as a shardable type whose split, join, pad
and unpad are themselves lazy: collecting the per-rank futures of a non-blocking
``DP_COMPUTE_PROTO`` call gives one future of the joined, unpadded batch, and nothing is
computed until someone calls ``get()``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from sc_dispatch import NotShardableError
from sc_dispatch.ext import (
    concat_outputs,
    get_shard_adapter,
    register_future_type,
    register_shardable,
    unpad_output,
)

__all__ = ["LazyFuture"]

T = TypeVar("T")

_UNSET: Any = object()


class LazyFuture(Generic[T]):
    """A value computed on first :meth:`get`, by ``resolve()``."""

    __slots__ = ("_error", "_lock", "_resolve", "_value", "description")

    def __init__(self, resolve: Callable[[], T], description: str = "") -> None:
        self._resolve: Callable[[], T] | None = resolve
        self._value: Any = _UNSET
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self.description = description

    @classmethod
    def completed(cls, value: T, description: str = "") -> LazyFuture[T]:
        """A future that already holds ``value``."""
        fut: LazyFuture[T] = cls(lambda: value, description)
        fut._value = value
        fut._resolve = None
        return fut

    def done(self) -> bool:
        """Whether the value (or error) is known without computing anything."""
        return self._resolve is None

    def get(self) -> T:
        """The value; computes it on the first call; re-raises a failure every time."""
        if self._resolve is not None:
            with self._lock:
                resolve = self._resolve
                if resolve is not None:
                    try:
                        self._value = resolve()
                    except BaseException as exc:
                        self._error = exc
                    self._resolve = None
        if self._error is not None:
            raise self._error
        value: T = self._value
        return value

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        what = f" {self.description}" if self.description else ""
        return f"<LazyFuture{what} {state}>"


def _item(parts: LazyFuture[list[Any]], index: int) -> Any:
    return parts.get()[index]


def _adapter_for(value: object, op: str) -> Any:
    adapter = get_shard_adapter(value)
    if adapter is None:
        raise NotShardableError(
            f"LazyFuture.{op}: the future's value of type {type(value).__qualname__} cannot "
            "be split or joined; register an adapter with sc_dispatch.ext.register_shardable"
        )
    return adapter


class _LazyFutureAdapter:
    """Splits, joins and pads futures without waiting for their values."""

    def length(self, obj: LazyFuture[Any]) -> int:
        value = obj.get()
        return int(_adapter_for(value, "length").length(value))

    def chunk(self, obj: LazyFuture[Any], chunks: int) -> list[LazyFuture[Any]]:
        def split() -> list[Any]:
            value = obj.get()
            return list(_adapter_for(value, "chunk").chunk(value, chunks))

        parts = LazyFuture(split, f"chunks of {obj.description}")
        return [
            LazyFuture(functools.partial(_item, parts, i), f"chunk {i} of {obj.description}")
            for i in range(chunks)
        ]

    def concat(self, parts: Sequence[LazyFuture[Any]]) -> LazyFuture[Any]:
        items = list(parts)
        return LazyFuture(
            lambda: concat_outputs("LazyFuture.concat", [p.get() for p in items]),
            f"join of {len(items)} parts",
        )

    def pad(self, obj: LazyFuture[Any], pad_size: int) -> LazyFuture[Any]:
        def padded() -> Any:
            value = obj.get()
            return _adapter_for(value, "pad").pad(value, pad_size)

        return LazyFuture(padded, obj.description)

    def unpad(self, obj: LazyFuture[Any], pad_size: int) -> LazyFuture[Any]:
        return LazyFuture(lambda: unpad_output(obj.get(), pad_size), obj.description)

    def auto_padding(self, obj: LazyFuture[Any]) -> bool:
        value = obj.get()
        return bool(_adapter_for(value, "auto_padding").auto_padding(value))


register_future_type(LazyFuture)
register_shardable(LazyFuture, _LazyFutureAdapter())
