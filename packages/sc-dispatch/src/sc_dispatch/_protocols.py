"""The seams that keep sc-dispatch free of torch and of any backend.

* :class:`DispatchWorkerGroup` is what a dispatch function may ask of a worker group.
* :class:`ShardAdapter` tells sc-dispatch how to split, join and pad one container type;
  adapters are registered per type with :func:`sc_dispatch.ext.register_shardable`. An adapter
  that also tells the payload size of its objects meets :class:`SizedShardAdapter`.
* :class:`FutureLike` is what ``@register(materialize_futures=True)`` resolves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from ._mesh import MeshLayout

__all__ = ["DispatchWorkerGroup", "FutureLike", "ShardAdapter", "SizedShardAdapter"]

T = TypeVar("T")


@runtime_checkable
class DispatchWorkerGroup(Protocol):
    """What dispatch and collect functions need from a worker group.

    ``world_size`` is the number of ranks. ``query_mesh(mesh_name)`` returns the
    :class:`~sc_dispatch.MeshLayout` of a named device mesh (each rank's dp rank, collect
    flag and receives-data flag) for N-d dispatch; the group asks its workers once per mesh
    and caches the answer (:func:`~sc_dispatch.ask_mesh_layout` builds it from the workers'
    per-rank queries). A mesh some rank never registered is a
    :class:`~sc_dispatch.MeshLayoutError` naming the ranks (a ``KeyError`` from
    ``query_mesh`` is turned into one). A group may also have ``dead_ranks`` (a list of
    ranks), which the balanced and sticky modes avoid.
    ``sc_dispatch.testing.FakeWorkerGroup`` is a ready-made one for tests.
    """

    @property
    def world_size(self) -> int: ...

    def query_mesh(self, mesh_name: str) -> MeshLayout: ...


class ShardAdapter(Protocol[T]):
    """How one container type is split into shards, joined back, and padded.

    ``chunk`` must return exactly ``chunks`` parts whose lengths differ by at most one,
    earlier parts being the longer ones (``numpy.array_split`` sizes); it is only called
    with ``1 <= chunks <= length`` (any ``chunks >= 1`` when the length is ``None``).
    ``pad`` and ``unpad`` return new objects (or views) and never mutate their argument.

    An adapter may also define ``nbytes(obj) -> int``, the payload bytes of ``obj`` counted
    without copying; :func:`sc_dispatch.ext.payload_nbytes` then uses it (see
    :class:`SizedShardAdapter`). And ``take(obj, positions) -> T``, the rows at
    ``positions`` (a list of ints) in that order: the sticky mode routes rows with it. And
    ``metadata_only(obj) -> T``, an object of ``obj``'s length that holds its batch-level
    metadata but no row data: what an N-d mode sends the ranks of a mesh registered with
    ``receives_data=False`` (middle pipeline stages). It must depend only on the length and
    the metadata, which the shards of one batch share: a call makes one per argument and
    row count. Without it, those ranks receive the shard itself.
    """

    def length(self, obj: T) -> int | None:
        """Rows in ``obj``; ``None`` only for a future whose row count is not known yet."""
        ...

    def chunk(self, obj: T, chunks: int) -> list[T]: ...

    def concat(self, parts: Sequence[T]) -> T: ...

    def pad(self, obj: T, pad_size: int) -> T: ...

    def unpad(self, obj: T, pad_size: int) -> T: ...

    def auto_padding(self, obj: T) -> bool:
        """Whether ``obj`` may be padded so that it splits evenly."""
        ...


class SizedShardAdapter(ShardAdapter[T], Protocol):
    """A :class:`ShardAdapter` that also tells how many payload bytes an object carries."""

    def nbytes(self, obj: T) -> int:
        """The bytes of ``obj``'s payload (tensor elements, array buffers), a non-negative
        int, computed without copying or serializing; 0 for a handle to data elsewhere."""
        ...


@runtime_checkable
class FutureLike(Protocol):
    """A value computed elsewhere; ``get()`` blocks until it is available and returns it."""

    def get(self) -> Any: ...
