"""Shard slices: which rows of which shards make up a future's value.

A future's *slices* are an ordered list of :class:`ShardSlice` pieces -- rows
``start:stop`` of shard ``shard`` -- whose concatenation is the value. Slicing, chunking and
padding a future with known row counts only rewrite its slices (:func:`cut`), so that each
resulting future names just the shards it needs. This module is pure arithmetic on row
counts: no shard is touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ._errors import InvalidSizeError

__all__ = [
    "ShardSlice",
    "check_count",
    "chunk_bounds",
    "cut",
    "count_rows",
    "slice_shards",
]


class ShardSlice(NamedTuple):
    """Rows ``start:stop`` of shard number ``shard`` (an index into ``shard_refs``)."""

    shard: int
    start: int
    stop: int


def check_count(value: Any, what: str) -> int:
    """``value`` if it is a non-negative int (not a bool); else an InvalidSizeError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidSizeError(f"{what} must be a non-negative int, got {value!r}")
    return value


def slice_shards(row_counts: Sequence[int], start: int, stop: int) -> list[ShardSlice]:
    """The shards overlapping rows ``start:stop`` of the concatenation of shards with
    ``row_counts`` rows, with the local row range to take from each, in order.

    A consumer rank that owns rows ``start:stop`` fetches only the listed shards.
    """
    counts = [check_count(c, f"row_counts[{i}]") for i, c in enumerate(row_counts)]
    total = sum(counts)
    check_count(start, "start")
    check_count(stop, "stop")
    if start > stop or stop > total:
        raise InvalidSizeError(
            f"slice_shards: row range {start}:{stop} is not within the {total} rows of "
            f"shards with row counts {counts}"
        )
    out: list[ShardSlice] = []
    offset = 0
    for i, count in enumerate(counts):
        lo, hi = max(start, offset), min(stop, offset + count)
        if lo < hi:
            out.append(ShardSlice(i, lo - offset, hi - offset))
        offset += count
    return out


def count_rows(slices: Sequence[ShardSlice]) -> int:
    """The rows of the value that ``slices`` describes."""
    return sum(p.stop - p.start for p in slices)


def cut(slices: Sequence[ShardSlice], start: int, stop: int) -> list[ShardSlice]:
    """Rows ``start:stop`` of the value described by ``slices``."""
    out: list[ShardSlice] = []
    offset = 0
    for piece in slices:
        size = piece.stop - piece.start
        lo, hi = max(start, offset), min(stop, offset + size)
        if lo < hi:
            out.append(
                ShardSlice(piece.shard, piece.start + lo - offset, piece.start + hi - offset)
            )
        offset += size
    if not out and slices:
        # Keep an empty piece so that an empty result still has the columns of the shards.
        out.append(ShardSlice(slices[0].shard, slices[0].start, slices[0].start))
    return out


def chunk_bounds(total: int, chunks: int) -> list[tuple[int, int]]:
    """The row ranges of ``chunks`` parts of ``total`` rows (``numpy.array_split`` sizes)."""
    base, extra = divmod(total, chunks)
    bounds = []
    start = 0
    for i in range(chunks):
        size = base + 1 if i < extra else base
        bounds.append((start, start + size))
        start += size
    return bounds
