"""What a dispatch mode is: a name, a planner, and whether its outputs are rows.

Every call of a registered method is planned: :meth:`DispatchModeSpec.plan` turns the call's
arguments into a :class:`~sc_dispatch.WorkPlan` that a worker group runs (see ``_plan.py``).
Modes that cut a batch (``DP_COMPUTE_PROTO``, the N-d mesh modes, the balanced and sticky
modes) plan natively; a mode written in verl's spelling, a pair of functions, is adapted by
:class:`FunctionMode`:

* ``dispatch_fn(worker_group, *args, **kwargs)`` returns ``(args, kwargs)``, every value a
  list with one entry per rank (or anything, which every rank then receives whole); a
  splitting dispatch that padded the batch records the padding rows under
  :data:`~sc_dispatch.ext.PADDING_SIZE_KEY` in the returned keyword arguments;
* ``collect_fn(worker_group, outputs)`` joins the outputs, one per rank in rank order; with
  ``collect_sees_dispatch`` it also receives ``dispatched=(args, kwargs)``, what
  ``dispatch_fn`` returned for the same call (padding entry removed).

The adapter's plan pins unit *i* to rank *i* (verl's ``execute_all`` rule) and joins with
``collect_fn``, dropping the padding from the result when ``unpad_output``. verl's
``func_generator`` hook and :func:`~sc_dispatch.verl.get_predefined_dispatch_fn` read a
mode's functions through :attr:`DispatchModeSpec.dispatch_fn` / ``collect_fn``; every
predefined mode keeps verl's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypedDict, cast

from ._enums import Execute
from ._errors import DispatchModeTypeError, InvalidDispatchModeError
from ._plan import PlanFn, WorkPlan, rank_plan, rank_zero_plan
from ._shard import pop_padding_size, unpad_output

__all__ = [
    "CollectFn",
    "DispatchAwareCollectFn",
    "DispatchFn",
    "DispatchFnDict",
    "DispatchModeSpec",
    "Dispatched",
    "ExecuteFnDict",
    "FunctionMode",
]

DispatchFn = Callable[..., tuple[Sequence[Any], dict[str, Any]]]
CollectFn = Callable[[Any, Sequence[Any]], Any]
#: What a dispatch function returned for one call, ``(args, kwargs)``, each value holding one
#: entry per rank (for ``Execute.ALL``), without the padding entry.
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


def _check_flags(name: str, **flags: object) -> None:
    for field, value in flags.items():
        if not isinstance(value, bool):
            raise DispatchModeTypeError(
                f"dispatch mode {name}: {field} must be a bool, got {value!r}"
            )


@dataclass(frozen=True)
class FunctionMode:
    """A mode given as verl's pair of functions (see the module docstring), and its flags:
    ``unpad_output`` (drop the dispatch's padding rows from the collected output),
    ``row_aligned`` (``collect_fn`` joins row shards: a non-blocking call hands it futures
    that know their row counts) and ``collect_sees_dispatch``."""

    name: str
    dispatch_fn: DispatchFn
    collect_fn: CollectFn | DispatchAwareCollectFn
    unpad_output: bool = True
    row_aligned: bool = False
    collect_sees_dispatch: bool = False

    def __post_init__(self) -> None:
        for field in ("dispatch_fn", "collect_fn"):
            if not callable(getattr(self, field)):
                raise DispatchModeTypeError(
                    f"dispatch mode {self.name}: {field} must be callable, "
                    f"got {getattr(self, field)!r}"
                )
        _check_flags(
            self.name,
            unpad_output=self.unpad_output,
            row_aligned=self.row_aligned,
            collect_sees_dispatch=self.collect_sees_dispatch,
        )

    def plan(
        self,
        worker_group: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        rank_zero: bool = False,
    ) -> WorkPlan:
        """``dispatch_fn``'s per-rank arguments as units pinned one per rank (with
        ``rank_zero``, the dispatched arguments whole on rank 0), joined by ``collect_fn``
        (given rank 0's output alone with ``rank_zero``)."""
        d_args, raw_kwargs = self.dispatch_fn(worker_group, *args, **kwargs)
        d_kwargs = dict(raw_kwargs)
        pad = pop_padding_size(d_kwargs) if d_kwargs else 0
        dispatched: Dispatched = (tuple(d_args), d_kwargs)

        # one of two signatures, told apart by collect_sees_dispatch (checked when made)
        collect_fn: Any = self.collect_fn

        def collect(outputs: list[Any]) -> Any:
            joined = outputs[0] if rank_zero else outputs
            if self.collect_sees_dispatch:
                result = collect_fn(worker_group, joined, dispatched=dispatched)
            else:
                result = collect_fn(worker_group, joined)
            return unpad_output(result, pad) if pad and self.unpad_output else result

        if rank_zero:
            return rank_zero_plan(self.name, d_args, d_kwargs, collect)
        return rank_plan(self.name, worker_group.world_size, d_args, d_kwargs, collect)


@dataclass(frozen=True)
class DispatchModeSpec:
    """A resolved dispatch mode: its ``name``, its planner ``plan_fn(worker_group, *args,
    **kwargs) -> WorkPlan``, ``row_aligned`` (the outputs are row shards of the input: a
    non-blocking call gets futures that know their row counts, and the call can be
    streamed) and, where the mode has them, verl's ``functions``.

    Use :meth:`plan` to plan a call: it honours the execute mode, which ``plan_fn`` does
    not see.
    """

    name: str
    plan_fn: PlanFn
    row_aligned: bool = True
    functions: FunctionMode | None = None

    def __post_init__(self) -> None:
        if not callable(self.plan_fn):
            raise DispatchModeTypeError(
                f"dispatch mode {self.name}: plan_fn must be callable, got {self.plan_fn!r}"
            )
        _check_flags(self.name, row_aligned=self.row_aligned)
        if self.functions is not None and not isinstance(self.functions, FunctionMode):
            raise DispatchModeTypeError(
                f"dispatch mode {self.name}: functions must be a FunctionMode or None, "
                f"got {self.functions!r}"
            )

    @classmethod
    def from_functions(cls, functions: FunctionMode) -> DispatchModeSpec:
        """The spec of a mode that verl's pair of functions describe."""

        def plan_fn(worker_group: Any, *args: Any, **kwargs: Any) -> WorkPlan:
            return functions.plan(worker_group, args, kwargs)

        return cls(functions.name, plan_fn, functions.row_aligned, functions)

    def plan(
        self,
        worker_group: Any,
        execute_mode: Execute,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> WorkPlan:
        """The plan of one call. ``Execute.RANK_ZERO`` runs verl's functions on rank 0
        alone (the dispatched arguments whole, rank 0's output collected), as verl does."""
        if execute_mode is Execute.RANK_ZERO:
            return self._verl("Execute.RANK_ZERO").plan(worker_group, args, kwargs, rank_zero=True)
        plan = self.plan_fn(worker_group, *args, **kwargs)
        if not isinstance(plan, WorkPlan):
            raise DispatchModeTypeError(
                f"dispatch mode {self.name}: plan_fn returned {type(plan).__qualname__}, "
                "not a sc_dispatch WorkPlan"
            )
        return plan

    def _verl(self, what: str) -> FunctionMode:
        if self.functions is None:
            raise InvalidDispatchModeError(
                f"dispatch mode {self.name} has no dispatch_fn/collect_fn, which {what} needs"
            )
        return self.functions

    @property
    def dispatch_fn(self) -> DispatchFn:
        """verl's dispatch function of the mode (for verl's ``func_generator`` hook)."""
        return self._verl("dispatch_fn").dispatch_fn

    @property
    def collect_fn(self) -> CollectFn:
        """verl's collect function of the mode (for verl's ``func_generator`` hook)."""
        # a collect_sees_dispatch mode's function takes ``dispatched`` too (see FunctionMode)
        return cast(CollectFn, self._verl("collect_fn").collect_fn)
