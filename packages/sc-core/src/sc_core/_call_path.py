"""What happens when you call ``wg.m(batch)``: the one path of every call on a worker group.

``wg.m`` is a :class:`~sc_core.MethodProxy` (``_binding.py``). Calling it (blocking or not),
streaming it with ``.stream(...)``, and verl's ``execute_all_*`` all run here:

1. **plan** -- the method's dispatch mode turns the arguments into a
   :class:`~sc_dispatch.ext.WorkPlan` (``spec.plan``): units of work, each pinned to a slot
   (a rank, or the ranks of a dp group) or free for any slot. verl's ``execute_all_*`` plan
   one unit per rank (``rank_plan``).
2. **start** -- every pinned unit starts at once, in one :meth:`~sc_core.Backend.start` over
   all their ranks (a value that several ranks receive is sent once).
3. **wait**, **pending** or **stream** -- a blocking call waits for the values within the
   call's deadline (``Units.outputs``), and gives each free unit to a slot as it becomes
   idle (``_slots.py`` says which); a non-blocking call takes the backend's futures
   (``Units.pending``); a streamed call hands units back as each finishes (iterating
   ``Units``, through :class:`CallStream`). ``_units.py`` holds the unit runner.
4. **join** -- :meth:`WorkPlan.join <sc_dispatch.ext.WorkPlan.join>` makes the result: row
   shards in input order without their padding, or the mode's collect function.

A bound method's call (not verl's ``execute_all_*``) of a group that uses call ids
(:meth:`~sc_core.WorkerGroup.use_call_ids`) takes the next :class:`~sc_core.CallId`, which
every rank receives (``_units.start``; the worker's journal is ``_journal.py``).

Around every call, ``_CallWatch``: the call refuses dead ranks, warns about ranks still
busy with a call the group gave up on (and says so in a timeout's message), and finishes the
call's span, with the error when it fails (``_CallWatch.around``, the one place that does).
A failure gives up on the ranks still running (``give_up``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Generic, NoReturn, Protocol, TypeVar

from sc_dispatch import Execute, ScDispatchError
from sc_dispatch.ext import (
    DispatchModeSpec,
    RegisterAttrs,
    WorkPlan,
    WorkUnit,
    rank_plan,
    rank_zero_plan,
)

from ._backend import Backend
from ._busy import AbandonedCall, describe_busy
from ._call import Call, CallOptions
from ._call_ids import CallId
from ._errors import CallTimeoutError, UnsupportedCallError
from ._units import CallSite, Units, add_note, check_non_blocking

__all__ = ["CallStream", "call_method", "call_raw"]

logger = logging.getLogger("sc_core.worker_group")

R = TypeVar("R")


class Endpoint(Protocol):
    """A bound method, as a call sees it (a :class:`~sc_core.MethodProxy`)."""

    method_name: str
    attrs: RegisterAttrs
    spec: DispatchModeSpec
    call_options: CallOptions
    __qualname__: str


def new_call(
    site: CallSite, method_name: str, execute_mode: Execute, blocking: bool, timeout: float | None
) -> Call:
    """A call of ``method_name`` on the ranks ``execute_mode`` selects."""
    ranks = (0,) if execute_mode is Execute.RANK_ZERO else tuple(range(site.world_size))
    return Call(
        group=site.name_prefix,
        method_name=method_name,
        ranks=ranks,
        execute_mode=execute_mode,
        blocking=blocking,
        timeout=timeout,
    )


def _call_id(site: CallSite, method_name: str) -> CallId | None:
    """The id of a bound method's call, when the group uses call ids."""
    ids = site._sc_call_ids
    return None if ids is None else ids.next(site.name_prefix, method_name)


class _CallWatch:
    """The prologue and epilogue of one call: a warning when it waits behind busy ranks,
    and its span finished (a timeout names the ranks that were busy when it started)."""

    def __init__(self, site: CallSite, call: Call, backend: Backend) -> None:
        self.call = call
        self.waiting: dict[int, AbandonedCall] = {}
        busy = site._sc_runtime.liveness.busy
        if busy:
            self.waiting = busy.current(backend.is_done, call.ranks)
        if self.waiting:
            logger.warning(
                "worker group %s: %s waits on ranks %s, %s",
                site.name_prefix,
                call.method_name,
                sorted(self.waiting),
                describe_busy(self.waiting),
            )

    def fail(self, exc: BaseException) -> None:
        if self.waiting and isinstance(exc, CallTimeoutError):
            busy = describe_busy(self.waiting)
            add_note(exc, f"When this call started, ranks {sorted(self.waiting)} were {busy}.")
        self.call.span.finish(exc)

    def done(self) -> None:
        self.call.span.finish(None)

    @contextlib.contextmanager
    def around(self, *, finish: bool = True) -> Iterator[None]:
        """Run the call's body: an error finishes the span with it (and propagates); a body
        that returns finishes the span when ``finish`` (a stream finishes it at its end)."""
        try:
            yield
        except BaseException as exc:
            self.fail(exc)
            raise
        if finish:
            self.done()


# --- the adverbs: a call, a raw call, a stream --------------------------------------------


def _blocking(proxy: Endpoint) -> bool:
    blocking = proxy.call_options.blocking
    return proxy.attrs.blocking if blocking is None else blocking


def _timeout(site: CallSite, proxy: Endpoint) -> float | None:
    opts = proxy.call_options
    return opts.timeout if opts.has_timeout else site.default_timeout


def _plan(
    proxy: Endpoint, site: CallSite, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> WorkPlan:
    try:
        return proxy.spec.plan(site, proxy.attrs.execute_mode, args, kwargs)
    except ScDispatchError as exc:
        reraise_with_method(exc, proxy.__qualname__)


def call_method(
    site: CallSite, proxy: Endpoint, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """One call of a bound method: plan, start, wait (or take futures), join."""
    name = proxy.method_name
    backend = site._sc_backend(name)
    blocking = _blocking(proxy)
    call = new_call(site, name, proxy.attrs.execute_mode, blocking, _timeout(site, proxy))
    call.row_aligned = proxy.spec.row_aligned
    call.call_id = _call_id(site, name)
    span = call.span
    with _CallWatch(site, call, backend).around():
        with span.phase("dispatch"):
            plan = _plan(proxy, site, args, kwargs)
            if not blocking:
                check_non_blocking(plan, proxy.__qualname__)
        with span.phase("execute"):
            units = Units(site, call, plan, proxy.method_name, backend)
        if blocking:
            with span.phase("wait"):
                outputs = units.outputs()
        else:
            outputs = units.pending()
        with span.phase("collect"):
            try:
                result = plan.join(outputs)
            except ScDispatchError as exc:
                reraise_with_method(exc, proxy.__qualname__)
    return result


def call_raw(
    site: CallSite,
    method_name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    rank_zero: bool,
    blocking: bool,
) -> Any:
    """verl's ``execute_all_*`` / ``execute_rank_zero_*``: one unit per rank (verl's
    per-rank rule; rank 0 alone with ``rank_zero``). Blocking: the values (rank 0's alone
    with ``rank_zero``); otherwise the backend's handles (rank 0's alone)."""
    backend = site._sc_backend(method_name)
    mode = Execute.RANK_ZERO if rank_zero else Execute.ALL
    call = new_call(site, method_name, mode, blocking, site.default_timeout)
    if rank_zero:
        plan = rank_zero_plan(method_name, args, kwargs)
    else:
        plan = rank_plan(method_name, len(call.ranks), args, kwargs)
    with _CallWatch(site, call, backend).around():
        with call.span.phase("execute"):
            units = Units(site, call, plan, method_name, backend, check_alive=blocking)
        if blocking:
            with call.span.phase("wait"):
                result: Any = units.outputs()
        else:
            result = units.handles()
    return result[0] if rank_zero else result


class CallStream(Generic[R]):
    """The units of one streamed call, as ``(rows, shard)`` pairs: ``rows`` are the
    positions of the shard's rows in the input batch (padding excluded), ``shard`` the
    method's output for them; completion order, or input order with
    ``proxy.options(in_order=True)``.

    :meth:`result` returns the joined output, the same as a blocking call's (after
    iterating part of the stream, too). The call's deadline covers the whole stream; a
    worker failure ends it with the blocking call's typed error; :meth:`close` (or leaving a
    ``with`` block) stops waiting for the units still running.
    """

    def __init__(
        self,
        site: CallSite,
        proxy: Endpoint,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        in_order: bool,
    ) -> None:
        self._where = where = proxy.__qualname__
        spec = proxy.spec
        if not spec.row_aligned or proxy.attrs.execute_mode is not Execute.ALL:
            self._refuse(f"{spec.name} with {proxy.attrs.execute_mode.name} cannot")
        name = proxy.method_name
        backend = site._sc_backend(name)
        self._call = call = new_call(site, name, Execute.ALL, True, _timeout(site, proxy))
        call.row_aligned = True
        call.call_id = _call_id(site, name)
        self._watch = _CallWatch(site, call, backend)
        with self._watch.around(finish=False):
            with call.span.phase("dispatch"):
                plan = _plan(proxy, site, args, kwargs)
            if not plan.joins_in_order:
                self._refuse(f"{spec.name} joins with a collect function and cannot")
            if plan.length is None:
                raise UnsupportedCallError(
                    f"{where}: a streamed call needs batches whose row count is known; the "
                    "batch is a future that does not know it yet (get() the future first)"
                )
            self._units = Units(site, call, plan, name, backend)
        self._in_order = in_order
        self._expected = sorted((u for u in plan.units if u.rows), key=lambda u: min(u.rows))
        self._position = 0
        self._held: dict[int, tuple[WorkUnit, Any]] = {}
        self._closed = False

    def _refuse(self, why: str) -> NoReturn:
        raise UnsupportedCallError(
            f"{self._where}: stream needs a dispatch mode that cuts the batch into units "
            f"(DP_COMPUTE_PROTO, DP_COMPUTE_PROTO_BALANCED, an N-d mesh mode, a balanced or "
            f"sticky mode); {why}"
        )

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
        return unit.rows, output

    def _next_unit(self) -> tuple[WorkUnit, Any]:
        if not self._in_order:
            return next(self._units)
        if self._position >= len(self._expected):
            next(self._units, None)  # nothing left: ends the run
            raise StopIteration
        want = self._expected[self._position]
        while want.index not in self._held:
            unit, output = next(self._units)
            self._held[unit.index] = (unit, output)
        self._position += 1
        return self._held.pop(want.index)

    def _finish(self, exc: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        if exc is None:
            self._watch.done()
        else:
            self._watch.fail(exc)

    def result(self) -> R:
        """Every unit's output joined in input order: what a blocking call returns."""
        for _ in self:
            pass
        if not self._units.finished:
            raise UnsupportedCallError(f"{self._where}: the stream was closed before its end")
        try:
            joined: R = self._units.plan.join(self._units.outputs())
        except ScDispatchError as exc:
            reraise_with_method(exc, self._where)
        return joined

    def close(self) -> None:
        """Stop waiting for the units still running (their ranks are remembered as busy)."""
        if self._closed:
            return
        self._units.abandon(None)
        self._finish(None)

    def __enter__(self) -> CallStream[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reraise_with_method(exc: ScDispatchError, qualname: str) -> NoReturn:
    """Raise the same dispatch error with the bound method's name in front of its message."""
    try:
        renamed = type(exc)(f"{qualname}: {exc}")
    except Exception:  # an exotic subclass with another constructor: keep the original
        raise exc from None
    raise renamed from exc
