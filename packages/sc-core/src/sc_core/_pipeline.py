"""The call pipeline: dispatch → execute → wait (or pending) → collect.

One call of a bound method runs :func:`run_call`:

1. **dispatch** — the mode's ``dispatch_fn`` splits or replicates the arguments (and pads);
2. **execute** — the group's backend starts the method on every rank of the call
   (:meth:`~sc_core.Backend.start`) and returns a :class:`~sc_core.CallHandle`;
3. **wait** (blocking calls) — :meth:`~sc_core.Backend.wait` returns one value per rank
   within the deadline; or **pending** (non-blocking calls) — one future per rank;
4. **collect** — the mode's ``collect_fn`` joins the outputs (and drops the padding).

The :class:`~sc_core.Call` travels explicitly through every step; the handle carries what the
wait needs. Around it, :func:`running` refuses calls on dead ranks, warns about ranks still
busy with an abandoned call, and finishes the call's span.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from sc_dispatch import Execute, ScDispatchError
from sc_dispatch.ext import pop_padding_size, unpad_output

from ._backend import Backend, CallHandle, RankArgs
from ._busy import AbandonedCall, describe_busy
from ._call import Call
from ._errors import CallTimeoutError, WorkerDiedError, WorkerError, WorkerGroupError

if TYPE_CHECKING:
    from ._binding import MethodProxy
    from ._worker_group import WorkerGroup

__all__ = ["FUSED_METHOD_SEPARATOR", "per_rank_arguments", "run_call", "run_raw", "start"]

logger = logging.getLogger("sc_core.worker_group")

#: ``_fuw_execute("{role}_fwmn_{method}", ...)`` runs ``method`` of role ``role`` (verl's form).
FUSED_METHOD_SEPARATOR = "_fwmn_"


def new_call(
    group: WorkerGroup,
    method_name: str,
    execute_mode: Execute,
    blocking: bool,
    timeout: float | None,
    joins_shards: bool = False,
) -> Call:
    """A call of ``method_name`` on the ranks ``execute_mode`` selects."""
    ranks = (0,) if execute_mode is Execute.RANK_ZERO else tuple(range(group.world_size))
    return Call(
        group=group.name_prefix,
        method_name=method_name,
        ranks=ranks,
        execute_mode=execute_mode,
        blocking=blocking,
        timeout=timeout,
        joins_shards=joins_shards,
    )


def is_per_rank(world_size: int, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether every argument is a list of world-size entries (verl's split rule)."""
    return all(isinstance(v, list) and len(v) == world_size for v in (*args, *kwargs.values()))


def per_rank_arguments(
    world_size: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[RankArgs]:
    """verl's rule: when every argument is a list of world-size entries, rank ``i`` gets entry
    ``i`` of each; otherwise every rank gets all the arguments."""
    if is_per_rank(world_size, args, kwargs):
        return [
            (tuple(a[i] for a in args), {k: v[i] for k, v in kwargs.items()})
            for i in range(world_size)
        ]
    return [(args, kwargs)] * world_size


def route(
    group: WorkerGroup, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any], ranks: int
) -> tuple[str, tuple[Any, ...]]:
    """The worker method a call runs and its positional arguments: in a group made by
    ``spawn_fused``, ``_fuw_execute`` with ``"{role}_fwmn_{method}"`` first (one copy per
    rank when the arguments are per-rank lists)."""
    role = group._fused_role
    if role is None:
        return method_name, args
    target = f"{role}{FUSED_METHOD_SEPARATOR}{method_name}"
    per_rank = ranks > 1 and is_per_rank(ranks, args, kwargs)
    first: Any = [target] * ranks if per_rank else target
    return group.fused_worker_execute_fn_name, (first, *args)


def start(
    group: WorkerGroup,
    call: Call,
    method_name: str,
    rank_args: list[RankArgs],
    backend: Backend | None = None,
) -> CallHandle:
    """Start ``method_name`` on the call's ranks through the group's backend (``backend``,
    when the caller looked it up already)."""
    if backend is None:
        backend = group._sc_backend(method_name)
    handle = backend.start(call, method_name, rank_args)
    if len(handle.rank_handles) != len(call.ranks):
        raise WorkerGroupError(
            f"{type(group).__name__}.{method_name}: the backend started {len(handle.rank_handles)} "
            f"rank calls for ranks {list(call.ranks)}"
        )
    return handle


def wait(group: WorkerGroup, handle: CallHandle, backend: Backend | None = None) -> list[Any]:
    """The call's values; on a failure the group gives up on the ranks still running it."""
    call = handle.call
    if backend is None:
        backend = group._sc_backend(call.method_name)
    try:
        outputs = backend.wait(handle)
    except (CallTimeoutError, WorkerDiedError, WorkerError) as exc:
        if isinstance(exc, WorkerDiedError):
            reason = f"{exc.reason} during {call.method_name}" if exc.reason else ""
            group._liveness.mark_dead(exc.ranks, reason or f"died during {call.method_name}")
        give_up(group, handle, exc)
        raise
    if len(outputs) != len(call.ranks):
        raise WorkerGroupError(
            f"{type(group).__name__}: the backend returned {len(outputs)} values for ranks "
            f"{list(call.ranks)} of {call.method_name}"
        )
    return outputs


def give_up(group: WorkerGroup, handle: CallHandle, exc: BaseException | None) -> None:
    """The group stops waiting for a call: cancel what the backend can, remember the ranks
    still running it, and say so in ``exc``'s message (if any)."""
    call = handle.call
    backend = group._sc_backend(call.method_name)
    busy = group._liveness.busy
    for rank, rank_handle in zip(call.ranks, handle.rank_handles, strict=False):
        if backend.is_done(rank_handle):
            continue
        busy.record(rank, call.method_name, rank_handle, backend.cancel(rank_handle))
    still = busy.current(backend.is_done, call.ranks)
    if still:
        if exc is not None:
            add_note(exc, f"Ranks {sorted(still)} are {describe_busy(still)}.")
        logger.warning(
            "worker group %s: %s: ranks %s %s",
            group.name_prefix,
            call.method_name,
            sorted(still),
            describe_busy(still),
        )


def _waiting_behind(
    group: WorkerGroup, call: Call, backend: Backend | None = None
) -> dict[int, AbandonedCall]:
    """The call's ranks still busy with an abandoned call (logged: the call waits)."""
    liveness = group._liveness
    if not liveness.busy:
        return {}
    if backend is None:
        backend = group._sc_backend(call.method_name)
    waiting = liveness.busy.current(backend.is_done, call.ranks)
    if waiting:
        logger.warning(
            "worker group %s: %s waits on ranks %s, %s",
            group.name_prefix,
            call.method_name,
            sorted(waiting),
            describe_busy(waiting),
        )
    return waiting


def _finish_failed(call: Call, exc: BaseException, waiting: dict[int, AbandonedCall]) -> None:
    """Say in a timeout's message which ranks were busy when the call started; end the span."""
    if waiting and isinstance(exc, CallTimeoutError):
        add_note(
            exc,
            f"When this call started, ranks {sorted(waiting)} were {describe_busy(waiting)}.",
        )
    call.span.finish(exc)


@contextlib.contextmanager
def running(group: WorkerGroup, call: Call) -> Iterator[None]:
    """Refuse ``call`` if it touches dead ranks, warn if it waits behind busy ranks, and
    finish its span (with the error, if any) when it ends."""
    waiting = _waiting_behind(group, call)
    try:
        group._liveness.check_alive(call)
        yield
    except BaseException as exc:
        _finish_failed(call, exc, waiting)
        raise
    call.span.finish(None)


def run_raw(
    group: WorkerGroup, call: Call, method_name: str, rank_args: list[RankArgs]
) -> list[Any]:
    """Start ``method_name`` with per-rank arguments and wait for the values (no dispatch or
    collect): verl's ``execute_all_sync`` / ``execute_rank_zero_sync``."""
    span = call.span
    with running(group, call):
        with span.phase("execute"):
            handle = start(group, call, method_name, rank_args)
        with span.phase("wait"):
            return wait(group, handle)


def run_call(
    group: WorkerGroup, proxy: MethodProxy[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Dispatch, execute, wait (or not) and collect one call of a bound method."""
    opts = proxy.call_options
    attrs = proxy.attrs
    spec = proxy.spec
    name = proxy.method_name
    blocking = attrs.blocking if opts.blocking is None else opts.blocking
    timeout = opts.timeout if opts.has_timeout else group.default_timeout
    rank_zero = attrs.execute_mode is Execute.RANK_ZERO
    backend = group._sc_backend(name)
    call = new_call(group, name, attrs.execute_mode, blocking, timeout, spec.joins_shards)
    span = call.span
    waiting = _waiting_behind(group, call, backend)
    try:
        group._liveness.check_alive(call)
        with span.phase("dispatch"):
            try:
                d_args, d_kwargs = spec.dispatch_fn(group, *args, **kwargs)
            except ScDispatchError as exc:
                reraise_with_method(exc, proxy.__qualname__)
            d_kwargs = dict(d_kwargs)
            pad = pop_padding_size(d_kwargs) if d_kwargs else 0
        with span.phase("execute"):
            n = len(call.ranks)
            dispatched = (tuple(d_args), dict(d_kwargs))  # before route adds anything
            target, d_args = route(group, name, dispatched[0], d_kwargs, n)
            rank_args = (
                [(d_args, d_kwargs)] if rank_zero else per_rank_arguments(n, d_args, d_kwargs)
            )
            handle = start(group, call, target, rank_args, backend)
        if blocking:
            with span.phase("wait"):
                outputs = wait(group, handle, backend)
        else:
            outputs = backend.pending(handle)
        with span.phase("collect"):
            try:
                joined = outputs[0] if rank_zero else outputs
                result = spec.collect(group, joined, dispatched)
                if pad and spec.unpad_output:
                    result = unpad_output(result, pad)
            except ScDispatchError as exc:
                reraise_with_method(exc, proxy.__qualname__)
    except BaseException as exc:
        _finish_failed(call, exc, waiting)
        raise
    span.finish(None)
    return result


def add_note(exc: BaseException, note: str) -> None:
    """Append ``note`` to ``exc``'s message (Python 3.10 has no ``add_note``)."""
    if note in str(exc):
        return
    first = str(exc.args[0]) if exc.args else ""
    exc.args = (f"{first}\n{note}" if first else note, *exc.args[1:])


def reraise_with_method(exc: ScDispatchError, qualname: str) -> NoReturn:
    """Raise the same dispatch error with the bound method's name in front of its message."""
    try:
        renamed = type(exc)(f"{qualname}: {exc}")
    except Exception:  # an exotic subclass with another constructor: keep the original
        raise exc from None
    raise renamed from exc
