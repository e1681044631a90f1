"""Streamed calls: ``proxy.stream(batch)`` yields ``(rows, shard)`` as each unit finishes.

A streamed call is a planned call (see ``_schedule.py``) whose units the driver receives
one at a time: ``rows`` are the positions of the shard's rows in the input batch (padding
excluded), ``shard`` is the method's output for them. The order is completion order, or
input order with ``proxy.options(in_order=True)``. :meth:`CallStream.result` returns the
joined output, the same as a blocking call's. The call's deadline covers the whole stream;
a worker failure ends it with the same typed error as a blocking call, and the call's span
records every unit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sc_dispatch import Execute, ScDispatchError
from sc_dispatch.ext import WorkPlan, WorkUnit

from ._errors import UnsupportedCallError
from ._pipeline import _finish_failed, _waiting_behind, new_call, reraise_with_method
from ._schedule import PlanRun

if TYPE_CHECKING:
    from ._binding import MethodProxy
    from ._busy import AbandonedCall
    from ._call import Call
    from ._worker_group import WorkerGroup

__all__ = ["CallStream", "open_plan", "run_planned"]

R = TypeVar("R")


def _plan_of(
    group: WorkerGroup,
    proxy: MethodProxy[Any, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
) -> WorkPlan:
    spec = proxy.spec
    if spec.plan_fn is None or proxy.attrs.execute_mode is not Execute.ALL:
        raise UnsupportedCallError(
            f"{proxy.__qualname__}: {what} needs a dispatch mode that cuts the batch into "
            f"units (DP_COMPUTE_PROTO, DP_COMPUTE_PROTO_BALANCED, an N-d mesh mode, a "
            f"balanced or sticky mode); {spec.name} with {proxy.attrs.execute_mode.name} "
            "cannot"
        )
    try:
        plan = spec.plan_fn(group, *args, **kwargs)
    except ScDispatchError as exc:
        reraise_with_method(exc, proxy.__qualname__)
    if not isinstance(plan, WorkPlan):
        raise UnsupportedCallError(
            f"{proxy.__qualname__}: the plan_fn of {spec.name} returned "
            f"{type(plan).__qualname__}, not a sc_dispatch.WorkPlan"
        )
    return plan


def open_plan(
    group: WorkerGroup,
    proxy: MethodProxy[Any, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
) -> tuple[Call, PlanRun, dict[int, AbandonedCall]]:
    """Start a planned call: its :class:`~sc_core.Call` (blocking, the proxy's deadline) and
    the :class:`PlanRun` that runs its units."""
    opts = proxy.call_options
    timeout = opts.timeout if opts.has_timeout else group.default_timeout
    name = proxy.method_name
    backend = group._sc_backend(name)
    call = new_call(group, name, Execute.ALL, True, timeout, True)
    waiting = _waiting_behind(group, call, backend)
    try:
        with call.span.phase("dispatch"):
            plan = _plan_of(group, proxy, args, kwargs, what)
        return call, PlanRun(group, call, plan, name, backend), waiting
    except BaseException as exc:
        _finish_failed(call, exc, waiting)
        raise


def run_planned(
    group: WorkerGroup, proxy: MethodProxy[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """A blocking call of a scheduled mode: every unit run, the outputs joined in input
    order (the same result as the even split)."""
    opts = proxy.call_options
    if not (proxy.attrs.blocking if opts.blocking is None else opts.blocking):
        raise UnsupportedCallError(
            f"{proxy.__qualname__}: {proxy.spec.name} schedules its units from the driver and "
            "has no non-blocking form; call it blocking, or stream it with .stream(...)"
        )
    return CallStream(group, proxy, args, kwargs, in_order=False).result()


class CallStream(Generic[R]):
    """The units of one streamed call, as ``(rows, shard)`` pairs (see the module docstring).

    Iterate it, or call :meth:`result` for the joined output (after iterating part of it,
    too: the units already handed out are kept). :meth:`close` (or leaving a ``with``
    block) stops waiting for the units still running.
    """

    def __init__(
        self,
        group: WorkerGroup,
        proxy: MethodProxy[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        in_order: bool,
    ) -> None:
        self._where = proxy.__qualname__
        self._call, self._run, self._waiting = open_plan(group, proxy, args, kwargs, "stream")
        self._in_order = in_order
        plan = self._run.plan
        self._expected = sorted((u for u in plan.units if len(u.rows)), key=lambda u: min(u.rows))
        self._position = 0
        self._held: dict[int, Any] = {}
        self._outputs: dict[int, Any] = {}
        self._closed = False

    @property
    def call(self) -> Call:
        """The call being streamed (its ranks, deadline and span)."""
        return self._call

    def __iter__(self) -> Iterator[tuple[Sequence[int], R]]:
        return self

    def __next__(self) -> tuple[Sequence[int], R]:
        if self._closed:
            raise StopIteration
        try:
            unit, output = self._next_unit()
        except StopIteration:
            self._finish(None)
            raise
        except BaseException as exc:
            self._finish(exc)
            raise
        self._outputs[unit.index] = output
        return unit.rows, output

    def _next_unit(self) -> tuple[WorkUnit, Any]:
        if not self._in_order:
            return next(self._run)
        if self._position >= len(self._expected):
            next(self._run, None)  # nothing left: ends the run
            raise StopIteration
        want = self._expected[self._position]
        while want.index not in self._held:
            unit, output = next(self._run)
            self._held[unit.index] = (unit, output)
        self._position += 1
        held: tuple[WorkUnit, Any] = self._held.pop(want.index)
        return held

    def _finish(self, exc: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        if exc is None:
            self._call.span.finish(None)
        else:
            _finish_failed(self._call, exc, self._waiting)

    def result(self) -> R:
        """Every unit's output joined in input order: what a blocking call returns."""
        for _ in self:
            pass
        if not self._run.finished:
            raise UnsupportedCallError(f"{self._where}: the stream was closed before its end")
        plan = self._run.plan
        outputs = [self._outputs.get(u.index) for u in plan.units]
        try:
            joined: R = plan.join(outputs)
        except ScDispatchError as exc:
            reraise_with_method(exc, self._where)
        return joined

    def close(self) -> None:
        """Stop waiting for the units still running (their ranks are remembered as busy)."""
        if self._closed:
            return
        self._run.abandon(None)
        self._finish(None)

    def __enter__(self) -> CallStream[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
