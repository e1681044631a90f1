"""What a dispatch mode is: the signatures of its functions and its resolved spec.

A dispatch function has the signature ``dispatch_fn(worker_group, *args, **kwargs)`` and
returns ``(args, kwargs)`` in which every value is a list with one entry per rank (for
``Execute.ALL``) or the arguments as they are (for ``Execute.RANK_ZERO``). A splitting
dispatch function that padded the batch records the number of padding rows in the returned
keyword arguments under :data:`PADDING_SIZE_KEY`; the worker group pops it (see
:func:`pop_padding_size`) before the call and removes the padding from the collected output.
A collect function has the signature ``collect_fn(worker_group, outputs)`` where ``outputs``
has one entry per executed rank; a mode registered with ``collect_sees_dispatch=True`` is
also given, as the keyword ``dispatched``, the ``(args, kwargs)`` its dispatch function
returned for the same call (:meth:`DispatchModeSpec.collect` does this for a worker group).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict, cast

from ._errors import DispatchModeTypeError, InvalidDispatchModeError

if TYPE_CHECKING:
    from ._plan import WorkPlan

__all__ = [
    "PADDING_SIZE_KEY",
    "CollectFn",
    "DispatchFn",
    "DispatchFnDict",
    "DispatchAwareCollectFn",
    "DispatchModeSpec",
    "Dispatched",
    "ExecuteFnDict",
    "pop_padding_size",
]

#: Keyword under which a splitting dispatch function reports the padding rows it added.
PADDING_SIZE_KEY = "_sc_padding_size"

DispatchFn = Callable[..., tuple[Sequence[Any], dict[str, Any]]]
CollectFn = Callable[[Any, Sequence[Any]], Any]
#: What a dispatch function returned for one call, ``(args, kwargs)``, each value holding one
#: entry per rank (for ``Execute.ALL``), without the :data:`PADDING_SIZE_KEY` entry.
Dispatched = tuple[Sequence[Any], Mapping[str, Any]]


class DispatchAwareCollectFn(Protocol):
    """The collect function of a ``collect_sees_dispatch`` mode:
    ``collect_fn(worker_group, outputs, *, dispatched)``."""

    def __call__(
        self, worker_group: Any, outputs: Sequence[Any], /, *, dispatched: Dispatched
    ) -> Any: ...


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

    ``collect_sees_dispatch`` says that ``collect_fn`` needs to know how the input of the
    call was split: it is then called as ``collect_fn(worker_group, outputs,
    dispatched=(args, kwargs))`` with what ``dispatch_fn`` returned for this call (see
    :meth:`collect`), so that a mode keeps no state of its own between the two. Such a
    ``collect_fn`` is a :class:`DispatchAwareCollectFn`; the field keeps the
    :data:`CollectFn` type that worker groups have always called, so call it through
    :meth:`collect`.

    ``plan_fn`` (optional) describes a call as a :class:`~sc_dispatch.WorkPlan`: units of
    rows that a worker group can start one by one on free ranks and hand back as each
    finishes, which is what streaming a call needs. ``scheduled`` says that every call runs
    through the plan (the load-balanced and sticky modes); otherwise the plan is used only
    when a call is streamed, and a plain call keeps ``dispatch_fn`` / ``collect_fn``.
    """

    name: str
    dispatch_fn: DispatchFn
    collect_fn: CollectFn
    unpad_output: bool = True
    joins_shards: bool = False
    collect_sees_dispatch: bool = False
    plan_fn: Callable[..., WorkPlan] | None = None
    scheduled: bool = False

    def __post_init__(self) -> None:
        for field in ("dispatch_fn", "collect_fn"):
            if not callable(getattr(self, field)):
                raise DispatchModeTypeError(
                    f"dispatch mode {self.name}: {field} must be callable, "
                    f"got {getattr(self, field)!r}"
                )
        for field in ("unpad_output", "joins_shards", "collect_sees_dispatch", "scheduled"):
            if not isinstance(getattr(self, field), bool):
                raise DispatchModeTypeError(
                    f"dispatch mode {self.name}: {field} must be a bool, "
                    f"got {getattr(self, field)!r}"
                )
        if self.plan_fn is not None and not callable(self.plan_fn):
            raise DispatchModeTypeError(
                f"dispatch mode {self.name}: plan_fn must be callable or None, got {self.plan_fn!r}"
            )
        if self.scheduled and self.plan_fn is None:
            raise InvalidDispatchModeError(
                f"dispatch mode {self.name}: scheduled=True needs a plan_fn"
            )

    def collect(self, worker_group: Any, outputs: Any, dispatched: Dispatched) -> Any:
        """Run ``collect_fn`` on a call's ``outputs`` (one per rank; rank 0's alone for
        ``Execute.RANK_ZERO``), passing ``dispatched`` -- the call's ``(args, kwargs)`` from
        ``dispatch_fn``, padding entry removed -- when ``collect_sees_dispatch`` is set."""
        if self.collect_sees_dispatch:
            collect: Any = cast(Any, self.collect_fn)
            return collect(worker_group, outputs, dispatched=dispatched)
        return self.collect_fn(worker_group, outputs)


def pop_padding_size(kwargs: dict[str, Any]) -> int:
    """Remove and return the padding size a dispatch function recorded (0 when none)."""
    value = kwargs.pop(PADDING_SIZE_KEY, 0)
    return int(value)
