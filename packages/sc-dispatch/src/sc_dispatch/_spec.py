"""What a dispatch mode is: the signatures of its functions and its resolved spec.

A dispatch function has the signature ``dispatch_fn(worker_group, *args, **kwargs)`` and
returns ``(args, kwargs)`` in which every value is a list with one entry per rank (for
``Execute.ALL``) or the arguments as they are (for ``Execute.RANK_ZERO``). A splitting
dispatch function that padded the batch records the number of padding rows in the returned
keyword arguments under :data:`PADDING_SIZE_KEY`; the worker group pops it (see
:func:`pop_padding_size`) before the call and removes the padding from the collected output.
A collect function has the signature ``collect_fn(worker_group, outputs)`` where ``outputs``
has one entry per executed rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from ._errors import DispatchModeTypeError

__all__ = [
    "PADDING_SIZE_KEY",
    "CollectFn",
    "DispatchFn",
    "DispatchFnDict",
    "DispatchModeSpec",
    "ExecuteFnDict",
    "pop_padding_size",
]

#: Keyword under which a splitting dispatch function reports the padding rows it added.
PADDING_SIZE_KEY = "_sc_padding_size"

DispatchFn = Callable[..., tuple[Sequence[Any], dict[str, Any]]]
CollectFn = Callable[[Any, Sequence[Any]], Any]


class DispatchFnDict(TypedDict):
    """verl's spelling of a dispatch mode: ``{"dispatch_fn": ..., "collect_fn": ...}``."""

    dispatch_fn: DispatchFn
    collect_fn: CollectFn


class ExecuteFnDict(TypedDict):
    """Names the worker-group method that runs a call: ``execute_all`` or ``execute_rank_zero``."""

    execute_fn_name: Literal["execute_all", "execute_rank_zero"]


@dataclass(frozen=True)
class DispatchModeSpec:
    """A resolved dispatch mode.

    ``unpad_output`` says whether the collected output is row-aligned with the input, so
    that padding rows added by the dispatch are dropped from it. It is ``False`` for
    modes that collect one value per worker (``DP_COMPUTE_METRIC``): every worker's value
    is kept.

    ``joins_shards`` says that ``collect_fn`` joins the per-rank shards of a row-split batch
    (``DP_COMPUTE_PROTO``, ``DP_COMPUTE_PROTO_WITH_FUNC``, N-d mesh modes). For a
    non-blocking call a backend then hands ``collect_fn`` futures that know their row counts,
    so that the joined future can be split again without fetching anything; every other mode
    receives the backend's plain handles (Ray object references on Ray), as in verl.
    """

    name: str
    dispatch_fn: DispatchFn
    collect_fn: CollectFn
    unpad_output: bool = True
    joins_shards: bool = False

    def __post_init__(self) -> None:
        for field in ("dispatch_fn", "collect_fn"):
            if not callable(getattr(self, field)):
                raise DispatchModeTypeError(
                    f"dispatch mode {self.name}: {field} must be callable, "
                    f"got {getattr(self, field)!r}"
                )
        for field in ("unpad_output", "joins_shards"):
            if not isinstance(getattr(self, field), bool):
                raise DispatchModeTypeError(
                    f"dispatch mode {self.name}: {field} must be a bool, "
                    f"got {getattr(self, field)!r}"
                )


def pop_padding_size(kwargs: dict[str, Any]) -> int:
    """Remove and return the padding size a dispatch function recorded (0 when none)."""
    value = kwargs.pop(PADDING_SIZE_KEY, 0)
    return int(value)
