"""What sc-ray teaches the packages below it, registered once when ``sc_ray`` is imported.

* sc-dispatch: :class:`~sc_ray.RayFuture` is a future, and it and plain Ray object references
  are shardable (joining them gives a ``DataProtoFuture``; nothing is fetched); an object
  reference resolves through ``ray.get``;
* sc-core: a ``ray.remote`` class unwraps to the user's class (so that ``LocalWorkerGroup``
  and colocation accept it).

This module imports both :mod:`sc_ray._futures` and (lazily) :mod:`sc_ray._proto_futures`,
which depends on ``_futures``: the registrations live here so that neither imports the other
back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sc_core.backend import register_class_unwrapper
from sc_dispatch.ext import register_future_resolver, register_future_type, register_shardable

from . import _ray_api as rapi
from ._futures import RayFuture, resolve_refs

__all__ = ["register_adapters"]


def _to_proto(parts: Sequence[RayFuture]) -> Any:
    from ._proto_futures import RayDataProtoFuture

    return RayDataProtoFuture.from_rank_futures(list(parts))


class _RayFutureAdapter:
    """Joining per-rank futures gives one DataProtoFuture; nothing is fetched."""

    def length(self, obj: RayFuture) -> int:
        return len(_to_proto([obj]))

    def chunk(self, obj: RayFuture, chunks: int) -> list[Any]:
        return list(_to_proto([obj]).chunk(chunks))

    def concat(self, parts: Sequence[RayFuture]) -> Any:
        return _to_proto(parts)

    def pad(self, obj: RayFuture, pad_size: int) -> Any:
        return _to_proto([obj]).pad(pad_size)

    def unpad(self, obj: RayFuture, pad_size: int) -> Any:
        return _to_proto([obj]).unpad(pad_size)

    def auto_padding(self, obj: RayFuture) -> bool:
        from sc_protocol import DataProtoConfig

        return bool(DataProtoConfig.auto_padding)


def _raw_future(refs: Sequence[Any]) -> Any:
    from sc_protocol import DataProtoFuture

    return DataProtoFuture(futures=list(refs))


class _ObjectRefAdapter:
    """Plain Ray object references (a verl-style non-blocking call's, or a user's): joining
    them gives a ``DataProtoFuture`` whose row counts are not known, as in verl."""

    def length(self, obj: rapi.ObjectRef) -> None:
        return None

    def chunk(self, obj: rapi.ObjectRef, chunks: int) -> list[Any]:
        return list(_raw_future([obj]).chunk(chunks))

    def concat(self, parts: Sequence[rapi.ObjectRef]) -> Any:
        return _raw_future(parts)

    def pad(self, obj: rapi.ObjectRef, pad_size: int) -> Any:
        return _raw_future([obj]).pad(pad_size)

    def unpad(self, obj: rapi.ObjectRef, pad_size: int) -> Any:
        return _raw_future([obj]).unpad(pad_size)

    def auto_padding(self, obj: rapi.ObjectRef) -> bool:
        from sc_protocol import DataProtoConfig

        return bool(DataProtoConfig.auto_padding)


def register_adapters() -> None:
    """Teach sc-dispatch and sc-core about Ray's objects (idempotent; run at import)."""
    register_future_type(RayFuture)
    register_shardable(RayFuture, _RayFutureAdapter())
    register_shardable(rapi.ObjectRef, _ObjectRefAdapter())
    register_future_resolver(rapi.ObjectRef, resolve_refs)
    register_class_unwrapper(rapi.remote_class_inner)
