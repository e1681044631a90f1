"""The ``ROUND_ROBIN`` dispatch mode: deal list items to the ranks like cards.

Item ``i`` of every list (or tuple) argument goes to rank ``i % world_size``; every other
argument goes, as it is, to every rank. Each rank returns one result per item it was dealt,
as a list or tuple, and the collect function puts the results back in the order of the
items: ``wg.method(items)[i]`` is the result for ``items[i]``. Where the ranks' costs grow
with the item index (sorted work, longer prompts last), dealing spreads them more evenly
than ``DP_COMPUTE_PROTO``'s contiguous shards.

Errors are sc-dispatch's own, so the worker group puts the method's name in front of them:
a call without any list argument, or with list arguments of different lengths, is a
:class:`~sc_dispatch.DispatchArgumentError`; a rank that returns something other than a
list or tuple is a :class:`~sc_dispatch.NotShardableError`, and one that returns another
number of results than it was dealt items is a :class:`~sc_dispatch.DispatchArgumentError`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from sc_core import Call, LazyFuture, current_call
from sc_dispatch import (
    CollectsResult,
    DispatchArgumentError,
    DispatchWorkerGroup,
    NotShardableError,
    is_future,
    register_dispatch_mode,
)

__all__ = ["ROUND_ROBIN", "collect_round_robin", "deal", "dispatch_round_robin", "undeal"]

_MODE = "ROUND_ROBIN"

# Items dealt to each rank, per call in flight, so that collect can check every rank's
# count exactly; keyed by id(call) with the call kept alongside (ids are reused). A call
# that fails before collect leaves its entry behind, hence the bound.
_MAX_PENDING = 1024
_pending_lock = threading.Lock()
_pending: OrderedDict[int, tuple[Call, list[int]]] = OrderedDict()


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
    call = current_call()
    if call is not None:
        with _pending_lock:
            _pending[id(call)] = (call, _deal_sizes(next(iter(lengths.values())), n))
            while len(_pending) > _MAX_PENDING:
                _pending.popitem(last=False)
    return out_args, out_kwargs


def collect_round_robin(worker_group: DispatchWorkerGroup, output: Sequence[Any]) -> Any:
    """Put the ranks' results back in the order of the items they were dealt.

    Inside a call on an sc-core worker group each rank's count is checked against the
    number of items it was dealt; otherwise the counts must at least form a deal. The
    outputs of a non-blocking call are futures: the result is then one
    :class:`~sc_core.LazyFuture` of the ordered list, checked when it is resolved.
    """
    n = _world_size(worker_group)
    if len(output) != n:
        raise DispatchArgumentError(
            f"{_MODE}: expected {n} outputs (one per rank), got {len(output)}"
        )
    call = current_call()
    dealt: list[int] | None = None
    if call is not None:
        with _pending_lock:
            entry = _pending.pop(id(call), None)
        if entry is not None and entry[0] is call:
            dealt = entry[1]
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
    register_dispatch_mode(_MODE, dispatch_round_robin, collect_round_robin, unpad_output=False)
)
