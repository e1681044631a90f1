"""The ``ROUND_ROBIN`` dispatch mode: deal list items to the ranks like cards.

Item ``i`` of every list (or tuple) argument goes to rank ``i % world_size``; every other
argument goes, as it is, to every rank. Each rank returns one result per item it was dealt,
as a list or tuple, and the collect function puts the results back in the order of the
items: ``wg.method(items)[i]`` is the result for ``items[i]``. Where the ranks' costs grow
with the item index (sorted work, longer prompts last), dealing spreads them more evenly
than ``DP_COMPUTE_PROTO``'s contiguous shards.

The mode is registered with ``collect_sees_dispatch=True``: the worker group hands the
collect function what the dispatch function returned for the same call, so it checks every
rank's count against the items it was dealt without keeping any state between the two.

Errors are sc-dispatch's own, so the worker group puts the method's name in front of them:
a call without any list argument, or with list arguments of different lengths, is a
:class:`~sc_dispatch.DispatchArgumentError`; a rank that returns something other than a
list or tuple is a :class:`~sc_dispatch.NotShardableError`, and one that returns another
number of results than it was dealt items is a :class:`~sc_dispatch.DispatchArgumentError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sc_core import LazyFuture
from sc_dispatch import (
    CollectsResult,
    DispatchArgumentError,
    NotShardableError,
    register_dispatch_mode,
)
from sc_dispatch.ext import Dispatched, DispatchWorkerGroup, is_future

__all__ = ["ROUND_ROBIN", "collect_round_robin", "deal", "dispatch_round_robin", "undeal"]

_MODE = "ROUND_ROBIN"


def deal(items: Sequence[Any], hands: int) -> list[list[Any]]:
    """``items`` dealt into ``hands`` lists: hand ``r`` holds items ``r, r + hands, ...``."""
    if hands < 1:
        raise DispatchArgumentError(f"{_MODE}: cannot deal to {hands} ranks")
    return [list(items[r::hands]) for r in range(hands)]


def undeal(hands: Sequence[Sequence[Any]]) -> list[Any]:
    """The inverse of :func:`deal`: the items of every hand back in their original order.

    The hands' lengths must be those of a deal: non-increasing from the first hand, and at
    most one apart.
    """
    sizes = [len(h) for h in hands]
    total = sum(sizes)
    expected = _deal_sizes(total, len(hands))
    if sizes != expected:
        raise DispatchArgumentError(
            f"{_MODE}: the ranks returned {sizes} results, which is not a round-robin deal of "
            f"{total} items over {len(hands)} ranks (expected {expected})"
        )
    return [hands[i % len(hands)][i // len(hands)] for i in range(total)]


def _deal_sizes(total: int, hands: int) -> list[int]:
    return [len(range(r, total, hands)) for r in range(hands)]


def _world_size(worker_group: DispatchWorkerGroup) -> int:
    size = getattr(worker_group, "world_size", None)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise DispatchArgumentError(
            f"{_MODE}: worker group {worker_group!r} has no positive integer world_size "
            f"(got {size!r})"
        )
    return size


def dispatch_round_robin(
    worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any
) -> tuple[list[list[Any]], dict[str, list[Any]]]:
    """Deal every list or tuple argument across the ranks; repeat the others for each rank.

    Returns one list per argument with one entry per rank, which every worker group hands
    out rank by rank.
    """
    n = _world_size(worker_group)
    named: list[tuple[str, Any]] = [(f"positional argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    lengths = {label: len(v) for label, v in named if isinstance(v, (list, tuple))}
    if not lengths:
        raise DispatchArgumentError(
            f"{_MODE}: no list or tuple argument to deal across {n} ranks; got "
            f"{[type(v).__qualname__ for _, v in named]}"
        )
    if len(set(lengths.values())) > 1:
        raise DispatchArgumentError(
            f"{_MODE}: the list arguments must have one length to be dealt together, got {lengths}"
        )

    def per_rank(value: Any) -> list[Any]:
        if isinstance(value, (list, tuple)):
            hands = deal(value, n)
            return [tuple(h) for h in hands] if isinstance(value, tuple) else hands
        return [value] * n

    out_args = [per_rank(a) for a in args]
    out_kwargs = {k: per_rank(v) for k, v in kwargs.items()}
    return out_args, out_kwargs


def _dealt_counts(dispatched: Dispatched, n: int) -> list[int]:
    """How many items each rank was dealt, read from the hands of the first dealt argument."""
    args, kwargs = dispatched
    for per_rank in [*args, *kwargs.values()]:
        hands = isinstance(per_rank, (list, tuple)) and len(per_rank) == n
        if hands and all(isinstance(hand, (list, tuple)) for hand in per_rank):
            return [len(hand) for hand in per_rank]
    raise DispatchArgumentError(
        f"{_MODE}: the dispatched arguments hold no dealt hands for {n} ranks "
        f"({len(args)} positional, keywords {sorted(kwargs)})"
    )


def collect_round_robin(
    worker_group: DispatchWorkerGroup,
    output: Sequence[Any],
    *,
    dispatched: Dispatched | None = None,
) -> Any:
    """Put the ranks' results back in the order of the items they were dealt.

    With ``dispatched`` -- what :func:`dispatch_round_robin` returned for this call, which a
    worker group passes because the mode is registered with ``collect_sees_dispatch`` --
    each rank's count is checked against the number of items it was dealt; without it the
    counts must at least form a deal. The outputs of a non-blocking call are futures: the
    result is then one :class:`~sc_core.LazyFuture` of the ordered list, checked when it is
    resolved.
    """
    n = _world_size(worker_group)
    if len(output) != n:
        raise DispatchArgumentError(
            f"{_MODE}: expected {n} outputs (one per rank), got {len(output)}"
        )
    dealt = None if dispatched is None else _dealt_counts(dispatched, n)
    parts = list(output)
    if any(is_future(p) for p in parts):
        return LazyFuture(
            lambda: _in_item_order([p.get() if is_future(p) else p for p in parts], dealt),
            f"{_MODE} results",
        )
    return _in_item_order(parts, dealt)


def _in_item_order(parts: list[Any], dealt: list[int] | None) -> list[Any]:
    for rank, part in enumerate(parts):
        if not isinstance(part, (list, tuple)):
            raise NotShardableError(
                f"{_MODE}: rank {rank} returned {type(part).__qualname__}; a round-robin "
                "method returns a list or tuple with one result per item it was dealt"
            )
    if dealt is not None:
        for rank, (part, count) in enumerate(zip(parts, dealt, strict=True)):
            if len(part) != count:
                raise DispatchArgumentError(
                    f"{_MODE}: rank {rank} returned {len(part)} results for the {count} "
                    "items it was dealt"
                )
    return undeal(parts)


#: The mode, registered with sc-dispatch when this package is imported. A call returns the
#: worker method's own return type (a list in item order), so it is declared a
#: :data:`~sc_dispatch.CollectsResult` mode for the type checker.
ROUND_ROBIN = CollectsResult(
    register_dispatch_mode(
        _MODE,
        dispatch_round_robin,
        collect_round_robin,
        unpad_output=False,
        collect_sees_dispatch=True,
    )
)
