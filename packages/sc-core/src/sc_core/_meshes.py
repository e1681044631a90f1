"""A worker group's mesh layouts: asked of its workers once per mesh, then cached.

``WorkerGroup.query_mesh(mesh)`` (what sc-dispatch's N-d modes read, through the public
``DispatchWorkerGroup`` protocol) answers from the group's :class:`MeshCache`; on a miss it
asks every worker through the group's verl-named methods ``_query_dispatch_info`` /
``_query_collect_info`` and sc's ``_query_receives_data_info`` (all registered
``ONE_TO_ALL`` on ``Worker``) and keeps the checked layout. Each group has its own cache
(a spawned role group starts empty); replacing workers clears the caches of every group
over them (``_replace.py``), since a new worker registers its own meshes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sc_dispatch.ext import MeshLayout, ask_mesh_layout

__all__ = ["MeshCache", "MeshSource"]


class MeshSource(Protocol):
    """What the cache asks: a group's size and its three per-rank mesh queries."""

    @property
    def world_size(self) -> int: ...

    def _query_dispatch_info(self, mesh_name: str) -> Sequence[int | None]: ...

    def _query_collect_info(self, mesh_name: str) -> Sequence[bool | None]: ...

    def _query_receives_data_info(self, mesh_name: str) -> Sequence[bool | None]: ...


class MeshCache:
    """The checked :class:`~sc_dispatch.MeshLayout` of each mesh a group was asked about.

    Only valid layouts are kept: a mesh some rank never registered raises
    :class:`~sc_dispatch.MeshLayoutError` (naming the ranks) on every ask until it is fixed.
    """

    def __init__(self) -> None:
        self._layouts: dict[str, MeshLayout] = {}

    def layout(self, group: MeshSource, mesh_name: str) -> MeshLayout:
        """``mesh_name``'s layout, asked of ``group``'s workers on the first call only.

        Two threads that miss at once both ask (the query is a call on the workers, not
        held under a lock); the first answer stored wins. Each dict operation is atomic."""
        found = self._layouts.get(mesh_name)
        if found is None:
            found = ask_mesh_layout(
                mesh_name,
                group.world_size,
                group._query_dispatch_info,
                group._query_collect_info,
                group._query_receives_data_info,
            )
            found = self._layouts.setdefault(mesh_name, found)
        return found

    def layouts(self) -> dict[str, MeshLayout]:
        """The cached layouts by mesh name (a copy)."""
        return dict(self._layouts)

    def put(self, mesh_name: str, layout: MeshLayout) -> None:
        """Cache ``layout`` for ``mesh_name`` (what the workers would answer)."""
        self._layouts[mesh_name] = layout

    def clear(self) -> None:
        """Forget every layout: the next ask goes to the workers again."""
        self._layouts.clear()
