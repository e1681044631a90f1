"""What sc-ray teaches the packages below it, registered once when ``sc_ray`` is imported.

* sc-dispatch: :class:`~sc_ray.RayFuture` is a future, and it and plain Ray object references
  are shardable (joining them gives a ``DataProtoFuture``; nothing is fetched); an object
  reference resolves through ``ray.get``;
* sc-core: a ``ray.remote`` class unwraps to the user's class (so that ``LocalWorkerGroup``
  and colocation accept it).

This module imports both :mod:`sc_ray._futures` and :mod:`sc_ray._proto_futures` (which
builds the sc-protocol future classes on first use, so that importing ``sc_ray`` imports
neither sc-protocol nor torch), and ``_proto_futures`` depends on ``_futures``: the
registrations live here so that neither imports the other back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sc_core.backend import register_class_unwrapper
from sc_dispatch.ext import register_future_resolver, register_future_type, register_shardable

from . import _ray_api as rapi
from ._futures import RayFuture, resolve_refs
from ._proto_futures import auto_padding, join_rank_futures, raw_future

__all__ = ["register_adapters"]


class _RayFutureAdapter:
    """Joining per-rank futures gives one DataProtoFuture; nothing is fetched."""

    def length(self, obj: RayFuture) -> int:
        return len(join_rank_futures([obj]))

    def chunk(self, obj: RayFuture, chunks: int) -> list[Any]:
        return list(join_rank_futures([obj]).chunk(chunks))

    def concat(self, parts: Sequence[RayFuture]) -> Any:
        return join_rank_futures(parts)

    def pad(self, obj: RayFuture, pad_size: int) -> Any:
        return join_rank_futures([obj]).pad(pad_size)

    def unpad(self, obj: RayFuture, pad_size: int) -> Any:
        return join_rank_futures([obj]).unpad(pad_size)

    def auto_padding(self, obj: RayFuture) -> bool:
        return auto_padding()


class _ObjectRefAdapter:
    """Plain Ray object references (a verl-style non-blocking call's, or a user's): joining
    them gives a ``DataProtoFuture`` whose row counts are not known, as in verl."""

    def length(self, obj: rapi.ObjectRef) -> None:
        return None

    def chunk(self, obj: rapi.ObjectRef, chunks: int) -> list[Any]:
        return list(raw_future([obj]).chunk(chunks))

    def concat(self, parts: Sequence[rapi.ObjectRef]) -> Any:
        return raw_future(parts)

    def pad(self, obj: rapi.ObjectRef, pad_size: int) -> Any:
        return raw_future([obj]).pad(pad_size)

    def unpad(self, obj: rapi.ObjectRef, pad_size: int) -> Any:
        return raw_future([obj]).unpad(pad_size)

    def auto_padding(self, obj: rapi.ObjectRef) -> bool:
        return auto_padding()


def register_adapters() -> None:
    """Teach sc-dispatch and sc-core about Ray's objects (idempotent; run at import)."""
    register_future_type(RayFuture)
    register_shardable(RayFuture, _RayFutureAdapter())
    register_shardable(rapi.ObjectRef, _ObjectRefAdapter())
    register_future_resolver(rapi.ObjectRef, resolve_refs)
    register_class_unwrapper(rapi.remote_class_inner)
