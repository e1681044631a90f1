"""A named device mesh's data-parallel layout, as a worker group reports it.

A worker that uses tensor or pipeline parallelism registers, per mesh name, its dp rank,
whether its output is collected and whether it reads the batch (a middle pipeline stage does
not: it gets its dp shard's metadata only). A worker group answers
:meth:`DispatchWorkerGroup.query_mesh` with one :class:`MeshLayout` per mesh (asking its
workers once and caching the answer); :func:`ask_mesh_layout` builds that layout from verl's
two per-rank queries (and sc's third, the receives-data flags) and turns a rank that never
registered the mesh into one :class:`~sc_dispatch.MeshLayoutError` naming the ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ._errors import DispatchArgumentError, MeshLayoutError

__all__ = ["MeshLayout", "ask_mesh", "ask_mesh_layout", "check_mesh_name"]

T = TypeVar("T")

#: How a worker registers a mesh, quoted in the errors about one that is missing.
_HOW_TO_REGISTER = (
    "a worker registers it with _register_dispatch_collect_info before the first call that "
    "dispatches on it"
)


def check_mesh_name(where: str, mesh_name: object) -> str:
    """``mesh_name`` if it is a non-empty ``str``, else a :class:`DispatchArgumentError`."""
    if not isinstance(mesh_name, str) or not mesh_name:
        raise DispatchArgumentError(
            f"{where}: mesh_name must be a non-empty string, got {mesh_name!r}"
        )
    return mesh_name


@dataclass(frozen=True)
class MeshLayout:
    """Each rank's data-parallel rank, collect flag and receives-data flag on one named mesh.

    ``dp_ranks[r]`` is rank ``r``'s dp rank; ``collect[r]`` says whether rank ``r``'s output
    is the one taken for its dp group; ``receives_data[r]`` (keyword only; default: every
    rank receives) says whether rank ``r`` gets its dp shard's data, or only its metadata
    (the same row count and batch-level metadata, no columns: a middle pipeline stage, see
    :meth:`ShardAdapter.metadata_only <sc_dispatch.ext.ShardAdapter>`). A layout is checked
    when it is made: as many flags as dp ranks, at least one rank, dp ranks exactly
    ``0..dp_size-1`` (ints), flags ``bool``s, exactly one collect rank per dp group and at
    least one rank that receives the data in each; anything else is a
    :class:`~sc_dispatch.MeshLayoutError` naming the mesh (``mesh_name``, used in messages
    only and not compared) and the ranks. Lists are accepted and stored as tuples; an empty
    ``receives_data`` is stored as one ``True`` per rank.

    ``MeshLayout.from_sizes(dp_size, tp_size)`` builds the usual layout of ``dp_size`` groups
    of ``tp_size`` consecutive ranks, each collected from its first rank.
    """

    dp_ranks: tuple[int, ...]
    collect: tuple[bool, ...]
    mesh_name: str = field(default="", compare=False)
    receives_data: tuple[bool, ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dp_ranks", tuple(self.dp_ranks))
        object.__setattr__(self, "collect", tuple(self.collect))
        receives = tuple(self.receives_data) or (True,) * len(self.dp_ranks)
        object.__setattr__(self, "receives_data", receives)
        name: object = self.mesh_name
        if not isinstance(name, str):
            raise MeshLayoutError(f"MeshLayout: mesh_name must be a str, got {name!r}")
        where = self._where()
        dp_values: tuple[object, ...] = self.dp_ranks
        flag_values: tuple[object, ...] = self.collect
        bad_dp = {
            r: d for r, d in enumerate(dp_values) if isinstance(d, bool) or not isinstance(d, int)
        }
        if bad_dp:
            raise MeshLayoutError(f"{where}: dp ranks must be ints; got (rank: value) {bad_dp}")
        bad_flags = {r: c for r, c in enumerate(flag_values) if not isinstance(c, bool)}
        if bad_flags:
            raise MeshLayoutError(
                f"{where}: collect flags must be bools; got (rank: value) {bad_flags}"
            )
        if len(self.dp_ranks) != len(self.collect):
            raise MeshLayoutError(
                f"{where}: expected one collect flag per dp rank, got {len(self.dp_ranks)} dp "
                f"ranks {list(self.dp_ranks)} and {len(self.collect)} collect flags "
                f"{list(self.collect)}"
            )
        if not self.dp_ranks:
            raise MeshLayoutError(f"{where}: the mesh has no ranks")
        dp_size = max(self.dp_ranks) + 1
        if min(self.dp_ranks) < 0 or set(self.dp_ranks) != set(range(dp_size)):
            raise MeshLayoutError(
                f"{where}: dp ranks must be exactly 0..{dp_size - 1}, got {list(self.dp_ranks)}"
            )
        collectors: dict[int, list[int]] = {d: [] for d in range(dp_size)}
        for rank, (dp, flag) in enumerate(zip(self.dp_ranks, self.collect, strict=True)):
            if flag:
                collectors[dp].append(rank)
        bad = {d: ranks for d, ranks in collectors.items() if len(ranks) != 1}
        if bad:
            detail = ", ".join(f"dp rank {d}: collect ranks {r}" for d, r in sorted(bad.items()))
            raise MeshLayoutError(
                f"{where}: every dp group needs exactly one collect rank; {detail} "
                f"(dp ranks {list(self.dp_ranks)}, collect flags {list(self.collect)})"
            )
        self._check_receives_data(where, dp_size)

    def _check_receives_data(self, where: str, dp_size: int) -> None:
        receives: tuple[object, ...] = self.receives_data
        bad_flags = {r: v for r, v in enumerate(receives) if not isinstance(v, bool)}
        if bad_flags:
            raise MeshLayoutError(
                f"{where}: receives-data flags must be bools; got (rank: value) {bad_flags}"
            )
        if len(receives) != len(self.dp_ranks):
            raise MeshLayoutError(
                f"{where}: expected one receives-data flag per dp rank, got "
                f"{len(self.dp_ranks)} dp ranks and {len(receives)} receives-data flags "
                f"{list(receives)}"
            )
        fed = {d for d, flag in zip(self.dp_ranks, self.receives_data, strict=True) if flag}
        starved = [d for d in range(dp_size) if d not in fed]
        if starved:
            detail = ", ".join(f"dp rank {d}: ranks {list(self.dp_groups[d])}" for d in starved)
            raise MeshLayoutError(
                f"{where}: every dp group needs at least one rank that receives the data "
                f"(registered with receives_data=True), or its shard reaches no worker; "
                f"{detail} all registered receives_data=False"
            )

    def _where(self) -> str:
        return f"mesh {self.mesh_name!r}" if self.mesh_name else "mesh layout"

    @classmethod
    def from_sizes(cls, dp_size: int, tp_size: int = 1, *, mesh_name: str = "") -> MeshLayout:
        """``dp_size`` dp groups of ``tp_size`` consecutive ranks (rank ``r`` has dp rank
        ``r // tp_size``), each collected from its first rank: a dp x tp mesh with tp
        innermost. Sizes must be ints >= 1 (a :class:`~sc_dispatch.MeshLayoutError`)."""
        for label, size in (("dp_size", dp_size), ("tp_size", tp_size)):
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise MeshLayoutError(
                    f"MeshLayout.from_sizes: {label} must be an int >= 1, got {size!r}"
                )
        world = dp_size * tp_size
        return cls(
            tuple(r // tp_size for r in range(world)),
            tuple(r % tp_size == 0 for r in range(world)),
            mesh_name=mesh_name,
        )

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return len(self.dp_ranks)

    @property
    def dp_size(self) -> int:
        """The number of dp groups."""
        return max(self.dp_ranks) + 1

    @property
    def dp_groups(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each dp group, in dp order."""
        return tuple(
            tuple(r for r, d in enumerate(self.dp_ranks) if d == dp) for dp in range(self.dp_size)
        )

    @property
    def data_ranks(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each dp group that receive its shard's data, in dp order."""
        return tuple(tuple(r for r in group if self.receives_data[r]) for group in self.dp_groups)

    @property
    def collect_ranks(self) -> tuple[int, ...]:
        """The collect rank of each dp group, in dp order."""
        found = {
            d: r
            for r, (d, flag) in enumerate(zip(self.dp_ranks, self.collect, strict=True))
            if flag
        }
        return tuple(found[dp] for dp in range(self.dp_size))


def ask_mesh(query: Callable[[str], T], mesh_name: str, world_size: int) -> T:
    """``query(mesh_name)``: a worker group's mesh query, per rank or whole. A rank that never
    registered the mesh raises a ``KeyError`` in the worker (sc-core's ``UnknownMeshError``,
    arriving as its ``WorkerError``, which names the first failing rank and the others);
    that is one :class:`~sc_dispatch.MeshLayoutError` on the driver."""
    try:
        return query(mesh_name)
    except KeyError as exc:
        first = getattr(exc, "rank", None)
        failed = sorted({first, *getattr(exc, "other_failed_ranks", ())} - {None})
        reason = getattr(exc, "error_message", None) or str(exc)
        raise _unregistered(mesh_name, failed, world_size, f" The worker said: {reason}") from exc


def _unregistered(mesh_name: str, ranks: list[int], world_size: int, more: str) -> MeshLayoutError:
    """The error for a mesh ``ranks`` never registered (all of them, or unknown if empty)."""
    which = (
        "no rank registered"
        if len(ranks) == world_size
        else f"ranks {ranks} did not register"
        if ranks
        else "some rank did not register"
    )
    return MeshLayoutError(
        f"{which} the mesh {mesh_name!r} ({_HOW_TO_REGISTER}); check the mesh name.{more}"
    )


def ask_mesh_layout(
    mesh_name: str,
    world_size: int,
    query_dispatch_info: Callable[[str], Sequence[int | None]],
    query_collect_info: Callable[[str], Sequence[bool | None]],
    query_receives_data_info: Callable[[str], Sequence[bool | None]] | None = None,
) -> MeshLayout:
    """The layout of ``mesh_name`` from verl's two per-rank queries: a worker group's
    ``_query_dispatch_info`` and ``_query_collect_info``, each returning one answer per rank;
    and, when given, sc's third, ``_query_receives_data_info`` (whether each rank receives
    its dp shard's data; without it every rank does).

    This is how a worker group implements :meth:`DispatchWorkerGroup.query_mesh` (sc-core's
    ``WorkerGroup`` does, and caches the result). A rank that never registered the mesh --
    its query raises a ``KeyError``, or answers ``None`` (verl) -- is a
    :class:`~sc_dispatch.MeshLayoutError` naming the ranks; so is a number of answers other
    than ``world_size``, and any layout :class:`MeshLayout` refuses.
    """
    check_mesh_name("ask_mesh_layout", mesh_name)
    raw_dp = list(ask_mesh(query_dispatch_info, mesh_name, world_size))
    raw_collect = list(ask_mesh(query_collect_info, mesh_name, world_size))
    raw_receives: list[bool | None] = (
        [True] * world_size
        if query_receives_data_info is None
        else list(ask_mesh(query_receives_data_info, mesh_name, world_size))
    )
    if len(raw_dp) != world_size or len(raw_collect) != world_size:
        raise MeshLayoutError(
            f"mesh {mesh_name!r}: expected one dp rank and one collect flag per rank (world size "
            f"{world_size}), got {len(raw_dp)} dp ranks and {len(raw_collect)} collect flags"
        )
    if len(raw_receives) != world_size:
        raise MeshLayoutError(
            f"mesh {mesh_name!r}: expected one receives-data flag per rank (world size "
            f"{world_size}), got {len(raw_receives)}"
        )
    missing = [
        r
        for r, (d, c, f) in enumerate(zip(raw_dp, raw_collect, raw_receives, strict=True))
        if d is None or c is None or f is None
    ]
    if missing:
        raise _unregistered(mesh_name, missing, world_size, "")
    return MeshLayout(
        tuple(d for d in raw_dp if d is not None),
        tuple(c for c in raw_collect if c is not None),
        mesh_name=mesh_name,
        receives_data=tuple(f for f in raw_receives if f is not None),
    )
