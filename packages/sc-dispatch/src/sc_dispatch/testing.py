"""A worker group without workers, for testing dispatch modes, planners and collect functions.

:class:`FakeWorkerGroup` meets :class:`~sc_dispatch.DispatchWorkerGroup`: a ``world_size``,
``query_mesh`` over the meshes it was given (asked once per mesh, then cached, as a real
group does) and ``dead_ranks``::

    from sc_dispatch import MeshLayout, make_nd_compute_dataproto_dispatch_fn
    from sc_dispatch.testing import FakeWorkerGroup

    group = FakeWorkerGroup(4, meshes={"actor": MeshLayout.from_sizes(dp_size=2, tp_size=2)})
    mode = make_nd_compute_dataproto_dispatch_fn("actor")
    args, kwargs = mode["dispatch_fn"](group, batch)

Standard library only, like the rest of sc-dispatch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from ._errors import DispatchArgumentError
from ._mesh import MeshLayout, ask_mesh_layout, check_mesh_name

__all__ = ["FakeWorkerGroup", "MeshAnswers", "MeshAnswersWithData"]

#: What the workers of a mesh answer, rank by rank: each rank's dp rank and collect flag,
#: ``None`` for a rank that never registered the mesh (verl's answer).
MeshAnswers = tuple[Sequence[int | None], Sequence[bool | None]]

#: The same, with each rank's receives-data flag as well.
MeshAnswersWithData = tuple[Sequence[int | None], Sequence[bool | None], Sequence[bool | None]]


class FakeWorkerGroup:
    """A :class:`~sc_dispatch.DispatchWorkerGroup` of ``world_size`` ranks and no workers.

    ``meshes`` maps a mesh name to its :class:`~sc_dispatch.MeshLayout`, or to the workers'
    raw answers ``(dp_ranks, collect_flags)`` (:data:`MeshAnswers`) or ``(dp_ranks,
    collect_flags, receives_data_flags)`` (:data:`MeshAnswersWithData`), which are checked only
    when the mesh is first asked for, as a real group's workers' answers are: so a test can
    give a bad layout and see the error a dispatch raises. A mesh that is not in ``meshes``
    is one no rank registered. ``dead_ranks`` are ranks the balanced and sticky modes avoid;
    the list may be changed during a test.

    ``query_mesh`` answers from ``mesh_cache`` (a plain dict a test may read or fill) and asks
    the "workers" only on a miss, counting each ask in ``mesh_queries``.
    """

    def __init__(
        self,
        world_size: int,
        meshes: Mapping[str, MeshLayout | MeshAnswers | MeshAnswersWithData] | None = None,
        *,
        dead_ranks: Iterable[int] = (),
    ) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise DispatchArgumentError(
                f"FakeWorkerGroup: world_size must be an int >= 1, got {world_size!r}"
            )
        self._world_size = world_size
        self._answers: dict[str, MeshAnswersWithData] = {}
        self.mesh_cache: dict[str, MeshLayout] = {}
        for name, value in (meshes or {}).items():
            check_mesh_name("FakeWorkerGroup", name)
            if isinstance(value, MeshLayout):
                self._answers[name] = (value.dp_ranks, value.collect, value.receives_data)
            elif isinstance(value, tuple) and len(value) == 2:
                self._answers[name] = (tuple(value[0]), tuple(value[1]), (True,) * world_size)
            elif isinstance(value, tuple) and len(value) == 3:
                self._answers[name] = (tuple(value[0]), tuple(value[1]), tuple(value[2]))
            else:
                raise DispatchArgumentError(
                    f"FakeWorkerGroup: mesh {name!r} must be a MeshLayout or a pair (dp ranks, "
                    f"collect flags) or a triple (dp ranks, collect flags, receives-data "
                    f"flags), got {type(value).__qualname__} {value!r}"
                )
        dead: list[object] = list(dead_ranks)
        bad = [r for r in dead if type(r) is not int or not 0 <= r < world_size]
        if bad:
            raise DispatchArgumentError(
                f"FakeWorkerGroup: dead_ranks must be ranks 0..{world_size - 1}, got {bad}"
            )
        self.dead_ranks: list[int] = sorted(set(dead_ranks))
        self.mesh_queries: Counter[str] = Counter()

    @property
    def world_size(self) -> int:
        return self._world_size

    def query_mesh(self, mesh_name: str) -> MeshLayout:
        """The layout of ``mesh_name``: from ``mesh_cache``, else asked (counted in
        ``mesh_queries``), checked with :func:`~sc_dispatch.ask_mesh_layout` and cached. A
        mesh no rank registered, or a bad layout, is a :class:`~sc_dispatch.MeshLayoutError`
        (nothing invalid is cached)."""
        check_mesh_name("FakeWorkerGroup.query_mesh", mesh_name)
        cached = self.mesh_cache.get(mesh_name)
        if cached is not None:
            return cached
        self.mesh_queries[mesh_name] += 1
        none = (None,) * self._world_size
        dp_ranks, collect, receives = self._answers.get(mesh_name, (none, none, none))
        layout = ask_mesh_layout(
            mesh_name,
            self._world_size,
            lambda _: dp_ranks,
            lambda _: collect,
            lambda _: receives,
        )
        self.mesh_cache[mesh_name] = layout
        return layout

    def __repr__(self) -> str:
        return (
            f"FakeWorkerGroup(world_size={self._world_size}, meshes={sorted(self._answers)}, "
            f"dead_ranks={self.dead_ranks})"
        )
