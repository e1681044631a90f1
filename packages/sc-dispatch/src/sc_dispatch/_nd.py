"""N-d mesh dispatch: split by data-parallel rank on a named device mesh."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NewType

from ._errors import DispatchArgumentError, MeshLayoutError
from ._mesh import MeshLayout, ask_mesh, check_mesh_name
from ._metadata import MetadataCache, metadata_arguments
from ._plan import Slot, WorkPlan, even_plan
from ._protocols import DispatchWorkerGroup
from ._shard import PADDING_SIZE_KEY, concat_outputs, split_args_kwargs
from ._spec import DispatchFnDict

__all__ = [
    "MeshDispatchFnDict",
    "MeshModeName",
    "make_nd_compute_dataproto_dispatch_fn",
    "mesh_layout",
    "mesh_slots",
]

#: The ``name`` of an N-d mesh dispatch mode; a distinct static type so that the type
#: checker tells a mesh mode (whose calls return the method's own return type) from any
#: other custom mapping.
MeshModeName = NewType("MeshModeName", str)


#: A planner, ``plan_fn(worker_group, *args, **kwargs) -> WorkPlan``.
PlanFnField = Callable[..., WorkPlan]


class MeshDispatchFnDict(DispatchFnDict):
    """The custom mode :func:`make_nd_compute_dataproto_dispatch_fn` returns: the dispatch
    and collect functions, the mode's ``name`` (``nd_dispatch_fn[<mesh>]``),
    ``row_aligned`` (``True``: the collect function joins row shards) and ``plan_fn``
    (the split as a :class:`~sc_dispatch.ext.WorkPlan`, one unit per dp group: what a
    worker group runs; the two functions are verl's, for its ``func_generator`` hook)."""

    name: MeshModeName
    row_aligned: bool
    plan_fn: PlanFnField


def mesh_layout(worker_group: DispatchWorkerGroup, mesh_name: str) -> tuple[list[int], list[bool]]:
    """Each rank's dp rank and collect flag on ``mesh_name``: the group's
    ``query_mesh(mesh_name)`` (which asks the workers once per mesh and caches the answer),
    checked against the group's world size. (``worker_group.query_mesh(mesh_name)`` has the
    receives-data flags too.)

    A mesh some rank never registered is a :class:`~sc_dispatch.MeshLayoutError` naming the
    mesh and the ranks (a ``KeyError`` from ``query_mesh`` included), and so is a layout with
    a number of ranks other than the group's ``world_size``.
    """
    check_mesh_name("mesh_layout", mesh_name)
    layout = _checked_layout(worker_group, mesh_name)
    return list(layout.dp_ranks), list(layout.collect)


def _checked_layout(worker_group: DispatchWorkerGroup, mesh_name: str) -> MeshLayout:
    mode = f"nd dispatch on mesh {mesh_name!r}"
    world = worker_group.world_size
    layout: object = ask_mesh(worker_group.query_mesh, mesh_name, world)
    if not isinstance(layout, MeshLayout):
        raise MeshLayoutError(
            f"{mode}: {type(worker_group).__qualname__}.query_mesh must return a "
            f"sc_dispatch.MeshLayout, got {type(layout).__qualname__}"
        )
    if layout.world_size != world:
        raise MeshLayoutError(
            f"{mode}: expected one dp rank and one collect flag per rank (world size {world}), "
            f"got {layout.world_size} dp ranks and {len(layout.collect)} collect flags"
        )
    return layout


def mesh_slots(worker_group: DispatchWorkerGroup, mesh_name: str) -> tuple[Slot, ...]:
    """One slot per dp group of ``mesh_name``: its ranks, its collect rank, and the ranks
    that receive the data (``None`` when all of them do)."""
    check_mesh_name("mesh_slots", mesh_name)
    layout = _checked_layout(worker_group, mesh_name)
    everyone = all(layout.receives_data)
    return tuple(
        Slot(ranks, collect, None if everyone else data)
        for ranks, collect, data in zip(
            layout.dp_groups, layout.collect_ranks, layout.data_ranks, strict=True
        )
    )


def _strip_for_non_receivers(
    mode: str,
    layout: MeshLayout,
    split_args: list[list[Any]],
    split_kwargs: dict[str, list[Any]],
    out_args: list[list[Any]],
    out_kwargs: dict[str, Any],
) -> None:
    """Give each rank that does not receive the data its dp shard's metadata-only form (in
    place in ``out_args`` / ``out_kwargs``; one object per argument and row count)."""
    cache: MetadataCache = {}
    meta_by_dp = [
        metadata_arguments(
            mode,
            tuple(shards[d] for shards in split_args),
            {k: shards[d] for k, shards in split_kwargs.items()},
            cache,
        )
        for d in range(layout.dp_size)
    ]
    for rank, (dp, receives) in enumerate(zip(layout.dp_ranks, layout.receives_data, strict=True)):
        if receives:
            continue
        meta_args, meta_kwargs = meta_by_dp[dp]
        for i, value in enumerate(meta_args):
            out_args[i][rank] = value
        for key, value in meta_kwargs.items():
            out_kwargs[key][rank] = value


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> MeshDispatchFnDict:
    """A custom dispatch mode that splits by dp rank on the mesh ``mesh_name``.

    The batch is split into ``dp_size`` shards (padded like ``DP_COMPUTE_PROTO`` when
    auto-padding is on); every rank of a dp group receives the same shard object; outputs
    are collected from each group's collect rank, in dp order. Use it as
    ``@register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))``.

    A rank registered with ``receives_data=False`` (a middle pipeline stage) receives its
    shard's metadata-only form instead: for a DataProto, one with the same ``meta_info`` and
    row count and no columns, one object shared by all such ranks of the call; arguments
    whose type has no such form (plain ``Rows``, TensorDicts, futures) reach it unchanged.
    """
    check_mesh_name("make_nd_compute_dataproto_dispatch_fn", mesh_name)
    mode = f"nd dispatch on mesh {mesh_name!r}"

    def nd_dispatch_fn(
        worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any
    ) -> tuple[list[list[Any]], dict[str, Any]]:
        layout = _checked_layout(worker_group, mesh_name)
        dp_ranks = layout.dp_ranks
        split_args, split_kwargs, pad = split_args_kwargs(mode, layout.dp_size, args, kwargs)
        out_args = [[shards[d] for d in dp_ranks] for shards in split_args]
        out_kwargs: dict[str, Any] = {
            k: [shards[d] for d in dp_ranks] for k, shards in split_kwargs.items()
        }
        if not all(layout.receives_data):
            _strip_for_non_receivers(mode, layout, split_args, split_kwargs, out_args, out_kwargs)
        if pad:
            out_kwargs[PADDING_SIZE_KEY] = pad
        return out_args, out_kwargs

    def nd_collect_fn(worker_group: DispatchWorkerGroup, output: Sequence[Any]) -> Any:
        dp_ranks, collect = mesh_layout(worker_group, mesh_name)
        if len(output) != len(dp_ranks):
            raise DispatchArgumentError(
                f"{mode}: expected {len(dp_ranks)} outputs (one per rank), got {len(output)}"
            )
        order = sorted(
            (dp, rank)
            for rank, (dp, flag) in enumerate(zip(dp_ranks, collect, strict=True))
            if flag
        )
        picked = [output[rank] for _, rank in order]
        return concat_outputs(mode, picked)

    def nd_plan_fn(worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any) -> WorkPlan:
        return even_plan(mode, mesh_slots(worker_group, mesh_name), args, kwargs)

    nd_dispatch_fn.__name__ = nd_dispatch_fn.__qualname__ = f"nd_dispatch_fn[{mesh_name}]"
    nd_collect_fn.__name__ = nd_collect_fn.__qualname__ = f"nd_collect_fn[{mesh_name}]"
    return {
        "dispatch_fn": nd_dispatch_fn,
        "collect_fn": nd_collect_fn,
        "name": MeshModeName(nd_dispatch_fn.__name__),
        "row_aligned": True,
        "plan_fn": nd_plan_fn,
    }
