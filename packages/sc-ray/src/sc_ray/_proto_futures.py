"""``RayDataProtoFuture``: the DataProtoFuture a non-blocking Ray call returns.

It subclasses ``sc_protocol.DataProtoFuture``, and importing sc-protocol imports torch; so
that importing ``sc_ray`` imports neither, the class is built the first time it is needed:
when a non-blocking call's per-rank results are joined (:func:`join_rank_futures`), or when
pickle looks up ``sc_ray._proto_futures.RayDataProtoFuture`` (this module's ``__getattr__``)
to rebuild one in a worker. Everything sc-ray does with sc-protocol's futures goes through
this module, which alone imports sc-protocol (inside its functions).

It holds the per-rank value references and the per-rank metadata references (row counts).
The row counts are fetched -- a few bytes each -- only when they are first needed: to know
the length, to chunk the future for a consumer group, to pad it. Chunking then yields plain
``DataProtoFuture`` parts with known row counts, each holding only the shards overlapping
its rows; a consumer rank fetches those itself and slices locally.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from sc_dispatch.ext import register_shardable

from ._futures import RayFuture, resolver

if TYPE_CHECKING:
    from sc_protocol import DataProtoFuture

__all__ = ["auto_padding", "join_rank_futures", "proto_future_class", "raw_future"]

_build_lock = threading.Lock()
_built: list[type[Any]] = []


def __getattr__(name: str) -> Any:
    # pickle finds the class by its module and name (a worker rebuilding a future)
    if name == "RayDataProtoFuture":
        return proto_future_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def auto_padding() -> bool:
    """sc-protocol's ``DataProtoConfig.auto_padding``."""
    from sc_protocol import DataProtoConfig

    return bool(DataProtoConfig.auto_padding)


def raw_future(refs: Sequence[Any]) -> DataProtoFuture[Any]:
    """A ``DataProtoFuture`` over plain Ray object references, row counts unknown (verl's)."""
    from sc_protocol import DataProtoFuture

    return DataProtoFuture(futures=list(refs))


def join_rank_futures(parts: Sequence[RayFuture]) -> DataProtoFuture[Any]:
    """One ``RayDataProtoFuture`` over the per-rank futures of a call, in rank order."""
    return cast("DataProtoFuture[Any]", proto_future_class()(list(parts)))


def proto_future_class() -> type[Any]:
    """The ``RayDataProtoFuture`` class (built, and registered as shardable, on first use)."""
    with _build_lock:
        if not _built:
            _built.append(_build())
        return _built[0]


def _build() -> type[Any]:
    from sc_protocol import DataProtoFuture
    from sc_protocol.ext import DataProtoFutureAdapter

    class RayDataProtoFuture(DataProtoFuture[Any]):
        """A DataProtoFuture over per-rank Ray references whose row counts arrive lazily."""

        def __init__(self, parts: Sequence[RayFuture], unpad: int = 0) -> None:
            # Every part of one call shares the call's deadline (or has none).
            self._sc_resolve = resolver(parts[0].deadline if parts else None)
            super().__init__(futures=[p.value_ref for p in parts], resolve=self._sc_resolve)
            self._sc_parts: tuple[RayFuture, ...] = tuple(parts)
            self._sc_unpad = unpad
            self._sc_known: DataProtoFuture | None = None

        @classmethod
        def from_rank_futures(cls, parts: Sequence[RayFuture]) -> DataProtoFuture[Any]:
            """Join per-rank futures, in order."""
            return cls(parts)

        def known(self) -> DataProtoFuture:
            """The same future with row counts: fetches the metadata once (a few bytes)."""
            if self._sc_known is None:
                counts = [p.rows() for p in self._sc_parts]
                base = DataProtoFuture.from_shards(
                    [p.value_ref for p in self._sc_parts], counts, resolve=self._sc_resolve
                )
                self._sc_known = base.unpad(self._sc_unpad) if self._sc_unpad else base
            return self._sc_known

        # Row operations go through the future with known counts; unpad stays lazy so that a
        # non-blocking call with auto-padding returns at once.
        @property
        def num_rows(self) -> int | None:
            return self.known().num_rows

        @property
        def shard_refs(self) -> tuple[Any, ...]:
            return tuple(p.value_ref for p in self._sc_parts)

        @property
        def row_counts(self) -> tuple[int | None, ...]:
            return self.known().row_counts

        @property
        def slices(self) -> Any:
            return self.known().slices

        def __len__(self) -> int:
            return len(self.known())

        def chunk(self, chunks: int) -> list[DataProtoFuture]:
            return self.known().chunk(chunks)

        def slice(self, start: int, stop: int) -> DataProtoFuture:
            return self.known().slice(start, stop)

        def shard_slices(self, start: int, stop: int) -> Any:
            return self.known().shard_slices(start, stop)

        def pad(self, pad_size: int) -> DataProtoFuture:
            return self.known().pad(pad_size)

        def unpad(self, pad_size: int) -> DataProtoFuture:
            if self._sc_known is not None:
                return self._sc_known.unpad(pad_size)
            return type(self)(self._sc_parts, self._sc_unpad + pad_size)

        def get(self) -> Any:
            """Fetch the shards and return them joined, a DataProto or a TensorDict as the
            workers returned (worker failures raise sc-core's ``WorkerError`` /
            ``WorkerDiedError``)."""
            for part in self._sc_parts:
                part.rows()  # a failed or late rank raises sc-core's error, naming the rank
            return self.known().get()

        def __repr__(self) -> str:
            state = "counts known" if self._sc_known is not None else "counts pending"
            return f"RayDataProtoFuture(shards={len(self._sc_parts)}, {state})"

        def __getstate__(self) -> dict[str, Any]:
            state = super().__getstate__()
            state["_sc_known"] = None
            return state

    class _RayDataProtoFutureAdapter(DataProtoFutureAdapter):
        """sc-protocol's future adapter; a Ray future knows its length once its row counts
        arrive, and joins the futures of known counts."""

        def length(self, obj: DataProtoFuture) -> int:
            return len(obj)

        def concat(self, parts: Sequence[DataProtoFuture]) -> DataProtoFuture:
            return DataProtoFuture.concat([cast(Any, p).known() for p in parts])

    RayDataProtoFuture.__qualname__ = "RayDataProtoFuture"  # pickle looks it up by name
    register_shardable(cast("type[Any]", RayDataProtoFuture), _RayDataProtoFutureAdapter())
    return RayDataProtoFuture
