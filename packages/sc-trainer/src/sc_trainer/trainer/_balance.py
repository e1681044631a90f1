"""Data-parallel load balancing: reorder a batch so each dp shard holds a similar token count.

A splitting dispatch mode cuts a batch into ``dp_size`` contiguous shards (sizes from
:func:`sc_dispatch.ext.chunk_sizes`). When rows differ in length, the shard that happens to hold
the long rows makes every other rank wait. :func:`balanced_order` returns a permutation of the
rows that keeps those shard sizes but spreads the tokens evenly (greedy longest-first into the
lightest shard that still has room).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from sc_dispatch.ext import chunk_sizes

from .._errors import TrainerConfigError

__all__ = ["balanced_order", "shard_token_sums"]


def balanced_order(token_counts: Sequence[int], dp_size: int) -> list[int]:
    """A permutation of ``range(len(token_counts))`` whose contiguous dp shards are balanced.

    Shard ``d`` of the reordered batch is rows ``order[start_d : start_d + size_d]`` with the
    sizes of :func:`sc_dispatch.ext.chunk_sizes`; within a shard, rows keep their original order.
    """
    n = len(token_counts)
    if dp_size < 1:
        raise TrainerConfigError(f"balanced_order: dp_size must be >= 1, got {dp_size}")
    if n < dp_size:
        raise TrainerConfigError(f"balanced_order: cannot split {n} rows into {dp_size} dp shards")
    if any(c < 0 for c in token_counts):
        raise TrainerConfigError(
            f"balanced_order: token counts must be >= 0, got minimum {min(token_counts)}"
        )
    capacity = chunk_sizes(n, dp_size)
    members: list[list[int]] = [[] for _ in range(dp_size)]
    # (token sum, shard) of the shards with room left; the lightest is popped first.
    heap = [(0, d) for d in range(dp_size)]
    for row in sorted(range(n), key=lambda i: (-token_counts[i], i)):
        total, d = heapq.heappop(heap)
        members[d].append(row)
        if len(members[d]) < capacity[d]:
            heapq.heappush(heap, (total + token_counts[row], d))
    return [row for shard in members for row in sorted(shard)]


def shard_token_sums(token_counts: Sequence[int], dp_size: int) -> list[int]:
    """Token count of each contiguous dp shard of a batch, in dispatch order."""
    if dp_size < 1:
        raise TrainerConfigError(f"shard_token_sums: dp_size must be >= 1, got {dp_size}")
    sums = []
    start = 0
    for size in chunk_sizes(len(token_counts), dp_size):
        sums.append(sum(token_counts[start : start + size]))
        start += size
    return sums
