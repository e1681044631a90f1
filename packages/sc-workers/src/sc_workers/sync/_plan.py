"""The transfer plan: which region of which parameter goes from which sender to which receiver.

Built once per pair of layouts (:func:`plan_for` caches it) from a *source* layout (the
trainer's ranks; its distinct regions cover every tensor exactly, replicas allowed) and a
*destination* layout (the rollout's ranks; any regions). For every destination rank and every
region it needs, the plan cuts the need along the source's distinct regions, so each needed
element is sent exactly once, and picks among a region's replicas the sender with the fewest
bytes assigned so far, so the senders share the work instead of one rank sending everything.

Parameters whose layouts look alike (same shape, same regions on every rank) share one cut,
computed once: a model of thousands of tensors has only a handful of such patterns.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from .._errors import SyncLayoutError
from ._layout import ModelLayout, Region

__all__ = ["Piece", "TransferPlan", "build_plan", "plan_for"]


@dataclass(frozen=True)
class Piece:
    """``region`` (full-tensor coordinates) of parameter ``name``, from source rank ``src`` to
    destination rank ``dst`` (each counted within its own group); ``nbytes`` in the source's
    dtype."""

    name: str
    src: int
    dst: int
    region: Region
    nbytes: int


@dataclass(frozen=True)
class TransferPlan:
    """Every piece of one sync, grouped by (sender, receiver) pair in a fixed order."""

    source: ModelLayout
    destination: ModelLayout
    pieces: tuple[Piece, ...]
    by_pair: Mapping[tuple[int, int], tuple[Piece, ...]] = field(repr=False)

    def sent_by(self, src: int) -> int:
        """Bytes source rank ``src`` sends."""
        return sum(p.nbytes for p in self.pieces if p.src == src)

    def received_by(self, dst: int) -> int:
        """Bytes destination rank ``dst`` receives (in the source's dtype)."""
        return sum(p.nbytes for p in self.pieces if p.dst == dst)

    def pieces_for(self, dst: int) -> list[Piece]:
        return [p for p in self.pieces if p.dst == dst]

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)


def _pattern(layout: ModelLayout, name: str) -> tuple[Region | None, ...]:
    return tuple(held.get(name) for held in layout.ranks)


def build_plan(source: ModelLayout, destination: ModelLayout) -> TransferPlan:
    """The plan that gives every destination rank its regions from ``source``.

    :class:`SyncLayoutError` when a tensor is missing on one side or its full shape differs,
    or when the source does not cover a tensor exactly."""
    missing = sorted(set(destination.shapes) - set(source.shapes))
    if missing:
        raise SyncLayoutError(
            f"weight sync: the rollout needs {len(missing)} tensors the trainer does not have, "
            f"e.g. {missing[:3]}"
        )
    for name, shape in destination.shapes.items():
        if source.shapes[name] != shape:
            raise SyncLayoutError(
                f"weight sync: {name!r} has shape {source.shapes[name]} in the trainer and "
                f"{shape} in the rollout"
            )
    source.check_covers("weight sync (trainer layout)")
    load = [0] * source.world_size
    cuts: dict[tuple[object, ...], list[tuple[int, Region, list[int]]]] = {}
    pieces: list[Piece] = []
    for name in sorted(destination.shapes):
        key = (source.shapes[name], _pattern(source, name), _pattern(destination, name))
        cut = cuts.get(key)
        if cut is None:
            cut = cuts[key] = _cut(source, destination, name)
        itemsize = source.nbytes(name, Region.full((1,)))
        for dst, region, holders in cut:
            nbytes = region.numel * itemsize
            src = min(holders, key=load.__getitem__)  # fewest bytes so far; lowest rank on ties
            load[src] += nbytes
            pieces.append(Piece(name, src, dst, region, nbytes))
    by_pair: dict[tuple[int, int], list[Piece]] = {}
    for piece in pieces:
        by_pair.setdefault((piece.src, piece.dst), []).append(piece)
    return TransferPlan(
        source, destination, tuple(pieces), {k: tuple(v) for k, v in sorted(by_pair.items())}
    )


def _cut(
    source: ModelLayout, destination: ModelLayout, name: str
) -> list[tuple[int, Region, list[int]]]:
    """For one tensor: (destination rank, region, source ranks that hold it) per piece."""
    distinct = list(source.distinct_regions(name).items())
    out = []
    for dst, held in enumerate(destination.ranks):
        need = held.get(name)
        if need is None:
            continue
        for region, holders in distinct:
            common = need.intersect(region)
            if common is not None:
                out.append((dst, common, holders))
    return out


_cache_lock = threading.Lock()
_cache: dict[tuple[int, int], tuple[ModelLayout, ModelLayout, TransferPlan]] = {}


def plan_for(source: ModelLayout, destination: ModelLayout) -> TransferPlan:
    """:func:`build_plan`, cached per pair of equal layouts (the last 8 pairs)."""
    key = (hash(_signature(source)), hash(_signature(destination)))
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None and hit[0] == source and hit[1] == destination:
        return hit[2]
    plan = build_plan(source, destination)
    with _cache_lock:
        if len(_cache) >= 8:
            _cache.pop(next(iter(_cache)))
        _cache[key] = (source, destination, plan)
    return plan


def _signature(layout: ModelLayout) -> tuple[object, ...]:
    return (
        tuple(sorted(layout.shapes.items())),
        tuple(sorted(layout.dtypes.items())),
        tuple(tuple(sorted(held.items(), key=lambda kv: kv[0])) for held in layout.ranks),
    )
