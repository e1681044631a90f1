"""The transfer plan: which region of which parameter goes from which sender to which receiver.

Built once per pair of layouts (:func:`plan_for` caches it) from a *source* layout (the
trainer's ranks; its distinct regions cover every tensor exactly, replicas allowed) and a
*destination* layout (the rollout's ranks; any regions). For every destination rank and every
region it needs, the plan cuts the need along the source's distinct regions, so each needed
element is sent exactly once, and picks among a region's replicas the sender with the fewest
bytes assigned so far, so the senders share the work instead of one rank sending everything.

Parameters whose layouts look alike (same shape, same regions on every rank) share one cut,
computed once, and their pieces are spread over a region's holders round robin: building a
plan costs per pattern, not per piece (a model of thousands of tensors has a handful of
patterns), and a rank lists only its own pieces (:meth:`TransferPlan.pair`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import NamedTuple

from .._errors import SyncLayoutError
from ._layout import ModelLayout, Region

__all__ = ["Piece", "TransferPlan", "build_plan", "plan_for"]


class Piece(NamedTuple):
    """``region`` (full-tensor coordinates) of parameter ``name``, from source rank ``src`` to
    destination rank ``dst`` (each counted within its own group); ``nbytes`` in the source's
    dtype."""

    name: str
    src: int
    dst: int
    region: Region
    nbytes: int


@dataclass(frozen=True)
class _Entry:
    """One cut of a pattern: destination ``dst`` needs ``region``; ``senders[j]`` sends it
    for the pattern's tensors ``j, j + len(senders), ...`` (round robin over the holders)."""

    dst: int
    region: Region
    senders: tuple[int, ...]


@dataclass(frozen=True)
class _Pattern:
    """Tensors whose layouts look alike (same full shape, same boxes on every rank)."""

    names: tuple[str, ...]
    itemsize: int
    entries: tuple[_Entry, ...]


@dataclass(frozen=True)
class TransferPlan:
    """Every piece of one sync. Pieces are built per (sender, receiver) pair on demand
    (:meth:`pair`): a rank only ever lists its own."""

    source: ModelLayout
    destination: ModelLayout
    _patterns: tuple[_Pattern, ...] = field(repr=False)
    _sent: tuple[int, ...] = field(repr=False)
    _received: tuple[int, ...] = field(repr=False)

    def pair(self, src: int, dst: int) -> list[Piece]:
        """The pieces ``src`` sends ``dst``, in the order both sides pack and unpack them."""
        out = []
        for pattern in self._patterns:
            for entry in pattern.entries:
                if entry.dst != dst or src not in entry.senders:
                    continue
                nbytes = entry.region.numel * pattern.itemsize
                step = len(entry.senders)
                for j, s in enumerate(entry.senders):
                    if s == src:
                        out += [
                            Piece(name, src, dst, entry.region, nbytes)
                            for name in pattern.names[j::step]
                        ]
        return out

    def receivers_of(self, src: int) -> list[int]:
        """The destination ranks ``src`` sends to."""
        return sorted(
            {e.dst for p in self._patterns for e in p.entries if src in e.senders[: len(p.names)]}
        )

    def senders_to(self, dst: int) -> list[int]:
        """The source ranks that send to ``dst``."""
        return sorted(
            {
                s
                for p in self._patterns
                for e in p.entries
                if e.dst == dst
                for s in e.senders[: len(p.names)]
            }
        )

    @property
    def by_pair(self) -> dict[tuple[int, int], list[Piece]]:
        """Every (sender, receiver) pair that exchanges bytes, and its pieces."""
        pairs = sorted(
            {
                (s, e.dst)
                for p in self._patterns
                for e in p.entries
                for s in e.senders[: len(p.names)]
            }
        )
        return {(s, d): self.pair(s, d) for s, d in pairs}

    @property
    def pieces(self) -> list[Piece]:
        return [piece for pieces in self.by_pair.values() for piece in pieces]

    def sent_by(self, src: int) -> int:
        """Bytes source rank ``src`` sends."""
        return self._sent[src]

    def received_by(self, dst: int) -> int:
        """Bytes destination rank ``dst`` receives (in the source's dtype)."""
        return self._received[dst]

    def pieces_for(self, dst: int) -> list[Piece]:
        return [p for s in range(self.source.world_size) for p in self.pair(s, dst)]

    @property
    def total_bytes(self) -> int:
        return sum(self._sent)

    @property
    def piece_count(self) -> int:
        return sum(len(p.names) * len(p.entries) for p in self._patterns)


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
    names = sorted(destination.shapes)
    groups: dict[tuple[object, ...], list[str]] = {}
    columns = _box_codes(source, names) + _box_codes(destination, names)
    keys = zip(
        map(source.shapes.__getitem__, names),
        map(source.dtypes.__getitem__, names),
        zip(*columns, strict=True),
        strict=True,
    )
    for name, key in zip(names, keys, strict=True):
        groups.setdefault(key, []).append(name)
    sent = [0] * source.world_size
    received = [0] * destination.world_size
    patterns = []
    # one tensor per pattern stands for all: same shape, same boxes on every rank
    source.check_covers("weight sync (trainer layout)", [names[0] for names in groups.values()])
    for names in groups.values():
        first = names[0]
        itemsize = source.nbytes(first, Region.full((1,)))
        entries = []
        for dst, region, holders in _cut(source, destination, first):
            nbytes = region.numel * itemsize
            # the least loaded holder takes the first tensor, the next one the second...
            order = tuple(sorted(holders, key=lambda r: (sent[r], r)))
            for j, s in enumerate(order):
                sent[s] += nbytes * len(names[j :: len(order)])
            received[dst] += nbytes * len(names)
            entries.append(_Entry(dst, region, order))
        patterns.append(_Pattern(tuple(names), itemsize, tuple(entries)))
    return TransferPlan(source, destination, tuple(patterns), tuple(sent), tuple(received))


def _box_codes(layout: ModelLayout, names: list[str]) -> list[list[int]]:
    """Per rank, a small int per tensor standing for its box (-1: none), equal for equal boxes.

    Grouping tensors by these codes instead of by the boxes themselves hashes each distinct
    box object once, not once per tensor and rank (a plan of 10,000 tensors over 8 ranks
    would otherwise hash 80,000 boxes)."""
    codes: dict[Region | None, int] = {None: -1}
    columns = []
    for held in layout.ranks:
        boxes = list(map(held.get, names))
        ids = list(map(id, boxes))
        first = dict(zip(ids, range(len(ids)), strict=True))  # the first tensor with each
        code = {i: codes.setdefault(boxes[at], len(codes) - 1) for i, at in first.items()}
        columns.append(list(map(code.__getitem__, ids)))
    return columns


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
