"""N-d mesh dispatch: split by data-parallel rank on a named device mesh."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NewType, TypeVar

from ._errors import DispatchArgumentError, MeshLayoutError
from ._predefined import concat_outputs
from ._protocols import DispatchWorkerGroup
from ._shard import split_args_kwargs
from ._spec import PADDING_SIZE_KEY, DispatchFnDict

if TYPE_CHECKING:
    from ._plan import WorkPlan

__all__ = [
    "MeshDispatchFnDict",
    "MeshModeName",
    "make_nd_compute_dataproto_dispatch_fn",
    "mesh_layout",
]

#: The ``name`` of an N-d mesh dispatch mode; a distinct static type so that the type
#: checker tells a mesh mode (whose calls return the method's own return type) from any
#: other custom mapping.
MeshModeName = NewType("MeshModeName", str)


#: A planner, ``plan_fn(worker_group, *args, **kwargs) -> WorkPlan``.
PlanFnField = Callable[..., "WorkPlan"]


class MeshDispatchFnDict(DispatchFnDict):
    """The custom mode :func:`make_nd_compute_dataproto_dispatch_fn` returns: the dispatch
    and collect functions, the mode's ``name`` (``nd_dispatch_fn[<mesh>]``),
    ``joins_shards`` (``True``: the collect function joins row shards) and ``plan_fn``
    (the same split as a :class:`~sc_dispatch.ext.WorkPlan`, one unit per dp group, which is
    what streaming a call needs)."""

    name: MeshModeName
    joins_shards: bool
    plan_fn: PlanFnField


T = TypeVar("T")


def _ask(query: Callable[[str], Sequence[T]], mesh_name: str, mode: str, world: int) -> list[T]:
    """One answer per rank from the group's mesh query. A rank that never registered the
    mesh raises a ``KeyError`` in the worker (sc-core's ``UnknownMeshError``, arriving as its
    ``WorkerError``, which names the first failing rank and the others); that is one
    :class:`~sc_dispatch.MeshLayoutError` on the driver."""
    try:
        return list(query(mesh_name))
    except KeyError as exc:
        first = getattr(exc, "rank", None)
        failed = sorted({first, *getattr(exc, "other_failed_ranks", ())} - {None})
        which = (
            "no rank registered"
            if len(failed) == world
            else f"ranks {failed} did not register"
            if failed
            else "some rank did not register"
        )
        reason = getattr(exc, "error_message", None) or str(exc)
        raise MeshLayoutError(
            f"{mode}: {which} the mesh {mesh_name!r} (a worker registers it with "
            f"_register_dispatch_collect_info before the first call that dispatches on it); "
            f"check the mesh name. The worker said: {reason}"
        ) from exc


def mesh_layout(worker_group: DispatchWorkerGroup, mesh_name: str) -> tuple[list[int], list[bool]]:
    """Each rank's dp rank and collect flag on ``mesh_name``, validated and cached.

    The worker group is asked once per mesh (``_query_dispatch_info`` and
    ``_query_collect_info``, one answer per rank, ``None`` for a rank that never registered
    the mesh); valid answers are kept in its ``_dispatch_info`` and ``_collect_info``
    caches. A mesh some rank never registered is a :class:`~sc_dispatch.MeshLayoutError`
    naming the mesh and the ranks.
    """
    mode = f"nd dispatch on mesh {mesh_name!r}"
    dispatch_info = worker_group._dispatch_info
    collect_info = worker_group._collect_info
    world = worker_group.world_size
    raw_dp: list[int | None] = list(
        dispatch_info[mesh_name]
        if mesh_name in dispatch_info
        else _ask(worker_group._query_dispatch_info, mesh_name, mode, world)
    )
    raw_collect: list[bool | None] = list(
        collect_info[mesh_name]
        if mesh_name in collect_info
        else _ask(worker_group._query_collect_info, mesh_name, mode, world)
    )
    if len(raw_dp) != world or len(raw_collect) != world:
        raise MeshLayoutError(
            f"{mode}: expected one dp rank and one collect flag per rank (world size {world}), "
            f"got {len(raw_dp)} dp ranks and {len(raw_collect)} collect flags"
        )
    missing = [
        r
        for r, (d, c) in enumerate(zip(raw_dp, raw_collect, strict=True))
        if d is None or c is None
    ]
    if missing:
        which = (
            "no rank registered" if len(missing) == world else f"ranks {missing} did not register"
        )
        raise MeshLayoutError(
            f"{mode}: {which} the mesh {mesh_name!r} (a worker registers it with "
            "_register_dispatch_collect_info before the first call that dispatches on it); "
            "check the mesh name"
        )
    dp_ranks = [int(d) for d in raw_dp if d is not None]
    collect = [bool(c) for c in raw_collect if c is not None]
    if not dp_ranks:
        raise MeshLayoutError(f"{mode}: the mesh has no ranks")
    dp_size = max(dp_ranks) + 1
    if sorted(set(dp_ranks)) != list(range(dp_size)) or min(dp_ranks) < 0:
        raise MeshLayoutError(f"{mode}: dp ranks must be exactly 0..{dp_size - 1}, got {dp_ranks}")
    collectors: dict[int, list[int]] = {d: [] for d in range(dp_size)}
    for rank, (dp, flag) in enumerate(zip(dp_ranks, collect, strict=True)):
        if flag:
            collectors[dp].append(rank)
    bad = {d: ranks for d, ranks in collectors.items() if len(ranks) != 1}
    if bad:
        detail = ", ".join(f"dp rank {d}: collect ranks {r}" for d, r in sorted(bad.items()))
        raise MeshLayoutError(
            f"{mode}: every dp group needs exactly one collect rank; {detail} "
            f"(dp ranks {dp_ranks}, collect flags {collect})"
        )
    dispatch_info[mesh_name] = dp_ranks
    collect_info[mesh_name] = collect
    return dp_ranks, collect


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> MeshDispatchFnDict:
    """A custom dispatch mode that splits by dp rank on the mesh ``mesh_name``.

    The batch is split into ``dp_size`` shards (padded like ``DP_COMPUTE_PROTO`` when
    auto-padding is on); every rank of a dp group receives the same shard object; outputs
    are collected from each group's collect rank, in dp order. Use it as
    ``@register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))``.
    """
    if not isinstance(mesh_name, str) or not mesh_name:
        raise DispatchArgumentError(f"mesh_name must be a non-empty string, got {mesh_name!r}")
    mode = f"nd dispatch on mesh {mesh_name!r}"

    def nd_dispatch_fn(
        worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any
    ) -> tuple[list[list[Any]], dict[str, Any]]:
        dp_ranks, _ = mesh_layout(worker_group, mesh_name)
        dp_size = max(dp_ranks) + 1
        split_args, split_kwargs, pad = split_args_kwargs(mode, dp_size, args, kwargs)
        out_args = [[shards[d] for d in dp_ranks] for shards in split_args]
        out_kwargs: dict[str, Any] = {
            k: [shards[d] for d in dp_ranks] for k, shards in split_kwargs.items()
        }
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
        from ._plan import even_plan, mesh_slots  # _plan builds on this module

        return even_plan(mode, mesh_slots(worker_group, mesh_name), args, kwargs)

    nd_dispatch_fn.__name__ = nd_dispatch_fn.__qualname__ = f"nd_dispatch_fn[{mesh_name}]"
    nd_collect_fn.__name__ = nd_collect_fn.__qualname__ = f"nd_collect_fn[{mesh_name}]"
    return {
        "dispatch_fn": nd_dispatch_fn,
        "collect_fn": nd_collect_fn,
        "name": MeshModeName(nd_dispatch_fn.__name__),
        "joins_shards": True,
        "plan_fn": nd_plan_fn,
    }
