"""``WorkerGroup``: binds registered worker methods as distributed calls; the backend contract.

A backend subclasses :class:`WorkerGroup`, fills ``self._workers`` (one handle per rank, in
rank order), calls ``self._bind_worker_method(worker_cls)`` at the end of its constructor,
and implements three hooks:

``_execute_rank_async(rank, method_name, args, kwargs) -> handle``
    Start ``method_name(*args, **kwargs)`` on rank ``rank`` and return at once with a
    backend handle (a Ray ``ObjectRef``, a ``concurrent.futures.Future``...).
``_wait(handles, call) -> list``
    Wait for the handles (one per rank in ``call.ranks``, in that order) and return their
    values, within ``call.remaining()`` seconds. Map failures to sc-core errors:
    :class:`~sc_core.WorkerError` for an exception in a worker (the lowest failing rank
    reported, the others listed), :class:`~sc_core.WorkerDiedError` for a dead worker (also
    call ``self._mark_workers_dead(ranks)``), :class:`~sc_core.CallTimeoutError` naming the
    ranks that had not answered at the deadline.
``_is_worker_alive(worker) -> bool``
    Whether the worker behind one entry of ``self._workers`` is still running.

and may override ``_pending_outputs(handles, call) -> list`` (turn handles into futures for
non-blocking calls; the default waits and wraps the values in
:class:`~sc_core.LazyFuture`), ``execute_all_async`` / ``execute_rank_zero_async`` (the
defaults call ``_execute_rank_async`` per rank) and ``_shallow_copy`` (used by ``spawn``).
"""

from __future__ import annotations

import contextlib
import copy
import enum
import logging
import os
import secrets
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    NoReturn,
    ParamSpec,
    TypeVar,
    cast,
    overload,
)

from sc_dispatch import (
    DispatchError,
    DispatchModeSpec,
    Execute,
    RegisterAttrs,
    RegisteredMethod,
    get_predefined_execute_fn,
    get_register_attrs,
    pop_padding_size,
    resolve_dispatch_mode,
    unpad_output,
)

from ._busy import AbandonedCall, BusyRanks, describe_busy
from ._call import Call, CallOptions, active_call, check_timeout
from ._errors import (
    BackendNotImplementedError,
    CallTimeoutError,
    ConfigTypeError,
    InvalidConfigError,
    MethodCollisionError,
    UnknownMethodError,
    UnknownRoleError,
    WorkerDiedError,
    WorkerError,
    WorkerGroupError,
)
from ._future import LazyFuture
from ._resource import ResourcePool

__all__ = ["MethodProxy", "WorkerGroup"]

logger = logging.getLogger("sc_core.worker_group")

P = ParamSpec("P")
Q = ParamSpec("Q")
R = TypeVar("R")
C = TypeVar("C")
WG = TypeVar("WG", bound="WorkerGroup")

if TYPE_CHECKING:
    # The worker class of a group, for the type checker only (``sc_core.mypy_plugin`` types
    # ``wg.method(...)`` calls with it). It defaults to ``Any`` (PEP 696), so that a bare
    # ``WorkerGroup`` / ``class MyGroup(WorkerGroup)`` stays valid under ``mypy --strict``.
    # ``typing_extensions`` is read from the type checker's own stubs: nothing imports it.
    from typing_extensions import TypeVar as _TypeVarWithDefault

    W = _TypeVarWithDefault("W", default=Any)
else:
    W = TypeVar("W")

#: Attribute of a colocated worker class mapping each role to ``{plain: prefixed}`` names.
COLOCATED_METHODS_ATTR = "__sc_colocated_methods__"

#: ``_fuw_execute("{role}_fwmn_{method}", ...)`` runs ``method`` of role ``role`` (verl's form).
FUSED_METHOD_SEPARATOR = "_fwmn_"


class _Keep(enum.Enum):
    KEEP = "keep"


KEEP = _Keep.KEEP


def _env_float(name: str) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    return check_timeout(name, value)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class MethodProxy(Generic[P, R]):
    """A worker method bound on a worker group: calling it runs the distributed call.

    ``proxy.options(timeout=..., blocking=...)`` returns a proxy with per-call overrides.
    ``method_name`` is the name the workers run; ``__name__`` the name on the group (they
    differ for the plain-name aliases of :meth:`WorkerGroup.spawn`).
    """

    def __init__(
        self,
        group: WorkerGroup,
        name: str,
        method_name: str,
        attrs: RegisterAttrs,
        spec: DispatchModeSpec,
        options: CallOptions = CallOptions(),  # noqa: B008 - frozen, shared on purpose
        doc: str | None = None,
    ) -> None:
        self._group = group
        self.method_name = method_name
        self.attrs = attrs
        self.spec = spec
        self.call_options = options
        self.__name__ = name
        self.__qualname__ = f"{type(group).__name__}.{name}"
        self.__doc__ = doc

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return cast("R", self._group._call_method(self, args, kwargs))

    @overload
    def options(
        self,
        *,
        timeout: float | _Keep | None = KEEP,
        blocking: Literal[True] | _Keep = KEEP,
    ) -> MethodProxy[P, R]: ...

    @overload
    def options(
        self,
        *,
        timeout: float | _Keep | None = KEEP,
        blocking: bool | _Keep | None = KEEP,
    ) -> MethodProxy[P, Any]: ...

    def options(
        self,
        *,
        timeout: float | _Keep | None = KEEP,
        blocking: bool | _Keep | None = KEEP,
    ) -> MethodProxy[P, Any]:
        """A proxy whose calls use ``timeout`` seconds (``None``: no limit) and ``blocking``
        instead of the defaults; arguments left out keep their current setting.

        For the type checker the proxy keeps its result type unless ``blocking`` may be
        false (``blocking=False`` or ``None``, which restores the registered default):
        then a call returns futures, typed ``Any``."""
        where = f"{self.__qualname__}.options"
        opts = self.call_options
        if timeout is not KEEP:
            opts = replace(opts, timeout=check_timeout(where, timeout), has_timeout=True)
        if blocking is not KEEP:
            if blocking is not None and not isinstance(blocking, bool):
                raise ConfigTypeError(
                    f"{where}: blocking must be a bool or None, "
                    f"got {type(blocking).__qualname__} {blocking!r}"
                )
            opts = replace(opts, blocking=blocking)
        return self._rebind(self._group, self.__name__, opts)

    def _rebind(
        self, group: WorkerGroup, name: str, options: CallOptions | None = None
    ) -> MethodProxy[P, R]:
        """The same method bound on ``group`` as ``name`` (with ``options``, if given)."""
        opts = self.call_options if options is None else options
        return MethodProxy(group, name, self.method_name, self.attrs, self.spec, opts, self.__doc__)

    def __repr__(self) -> str:
        target = "" if self.method_name == self.__name__ else f" -> {self.method_name}"
        return (
            f"<bound worker method {self.__qualname__}{target} dispatch={self.spec.name} "
            f"execute={self.attrs.execute_mode.name} blocking={self.attrs.blocking}>"
        )


class _Liveness:
    """Which ranks are known dead, and which are busy with an abandoned call; shared by a
    group and the groups spawned from it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.dead: dict[int, str] = {}
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.busy = BusyRanks()


class WorkerGroup(Generic[W]):
    """The base of every backend's worker group (verl's ``WorkerGroup``).

    After construction every ``@register``-ed method of the worker class is an attribute:
    ``wg.generate(batch)`` dispatches, executes on the workers, waits (if blocking) and
    collects. ``default_timeout`` (or ``SC_CALL_TIMEOUT``) bounds every call unless
    ``.options(timeout=...)`` says otherwise.

    For the type checker a group is generic in its worker class, ``WorkerGroup[MyWorker]``
    (inferred by the backends' constructors from ``ClassWithInitArgs(MyWorker, ...)``; a
    bare ``WorkerGroup`` means ``WorkerGroup[Any]``). ``wg.call(MyWorker.method, ...)``
    is typed for every checker; with ``plugins = ["sc_core.mypy_plugin"]`` mypy also types
    ``wg.method(...)`` itself.
    """

    fused_worker_execute_fn_name = "_fuw_execute"

    def __init__(
        self,
        resource_pool: ResourcePool | None,
        *,
        name_prefix: str | None = None,
        default_timeout: float | None = None,
    ) -> None:
        if resource_pool is not None and not isinstance(resource_pool, ResourcePool):
            raise ConfigTypeError(
                f"{type(self).__name__}: resource_pool must be a ResourcePool or None, "
                f"got {type(resource_pool).__qualname__}"
            )
        if name_prefix is not None and not isinstance(name_prefix, str):
            raise ConfigTypeError(
                f"{type(self).__name__}: name_prefix must be a str, "
                f"got {type(name_prefix).__qualname__} {name_prefix!r}"
            )
        if name_prefix is not None and not name_prefix:
            raise InvalidConfigError(
                f"{type(self).__name__}: name_prefix must be a non-empty str, got {name_prefix!r}"
            )
        self._bound_methods: dict[str, Any] = {}
        self._is_init_with_detached_workers = resource_pool is None
        self._resource_pool = resource_pool
        self.fused_worker_used = False
        self.name_prefix = name_prefix or secrets.token_hex(3)
        self.default_timeout = (
            check_timeout(f"{type(self).__name__}: default_timeout", default_timeout)
            if default_timeout is not None
            else _env_float("SC_CALL_TIMEOUT")
        )
        self._workers: list[Any] = []
        self._worker_names: list[str] = []
        self._dispatch_info: dict[str, list[int]] = {}
        self._collect_info: dict[str, list[bool]] = {}
        self._master_addr: str | None = None
        self._master_port: str | None = None
        self._user_defined_cls: type | None = None
        self._liveness = _Liveness()
        # The role of a group made by spawn_fused: its calls go through _fuw_execute.
        self._fused_role: str | None = None
        self.wg_dict: dict[str, WorkerGroup] | None = None
        self._spawned_from: WorkerGroup | None = None

    # --- the backend hooks -----------------------------------------------------------------

    # A full backend implements the three hooks below. A group that only binds methods with
    # its own ``func_generator`` (verl's extension point) needs none of them; calling one it
    # lacks is a BackendNotImplementedError naming the hook and the class.

    def _execute_rank_async(
        self, rank: int, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Start ``method_name(*args, **kwargs)`` on ``rank``; return a backend handle."""
        raise self._missing_hook("_execute_rank_async")

    def _wait(self, handles: Sequence[Any], call: Call) -> list[Any]:
        """The values behind ``handles`` (one per rank of ``call.ranks``), waited for within
        the call's deadline; failures raised as sc-core errors."""
        raise self._missing_hook("_wait")

    def _is_worker_alive(self, worker: Any) -> bool:
        """Whether the worker behind one entry of ``self._workers`` is running."""
        raise self._missing_hook("_is_worker_alive")

    def _handle_done(self, handle: Any) -> bool:
        """Whether the call behind ``handle`` has finished (a backend that cannot tell says
        ``True``: its ranks are never reported busy)."""
        return True

    def _cancel_handle(self, handle: Any) -> bool:
        """Try to stop the call behind ``handle``; whether the backend could ask for it."""
        return False

    def _missing_hook(self, hook: str) -> BackendNotImplementedError:
        return BackendNotImplementedError(
            f"{type(self).__qualname__} does not implement the backend hook {hook}; a worker "
            "group that runs calls itself implements _execute_rank_async, _wait and "
            "_is_worker_alive (see sc_core.WorkerGroup)"
        )

    def _pending_outputs(self, handles: Sequence[Any], call: Call) -> list[Any]:
        """For a non-blocking call: one future per handle that ``collect_fn`` can join.

        The default waits (within the deadline) and wraps each value in a finished
        :class:`~sc_core.LazyFuture`; a backend with real futures overrides it.
        """
        return [
            LazyFuture.completed(v, f"{call.method_name} rank {r}")
            for r, v in zip(call.ranks, self._wait(handles, call), strict=True)
        ]

    # --- verl's execute API ----------------------------------------------------------------

    @property
    def world_size(self) -> int:
        """The number of workers."""
        return len(self._workers)

    @property
    def workers(self) -> list[Any]:
        """The backend's worker handles, in rank order (a copy)."""
        return list(self._workers)

    @property
    def worker_names(self) -> list[str]:
        return list(self._worker_names)

    def _per_rank_arguments(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """verl's rule: when every argument is a list of world-size entries, rank ``i`` gets
        entry ``i`` of each; otherwise every rank gets all the arguments."""
        n = self.world_size
        if self._is_per_rank(args, kwargs):
            return [
                (tuple(a[i] for a in args), {k: v[i] for k, v in kwargs.items()}) for i in range(n)
            ]
        return [(args, kwargs)] * n

    def _is_per_rank(self, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
        """Whether every argument is a list of world-size entries (verl's split rule)."""
        n = self.world_size
        return all(isinstance(v, list) and len(v) == n for v in (*args, *kwargs.values()))

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method_name`` on every rank (arguments split by :meth:`_per_rank_arguments`);
        return one backend handle per rank."""
        self._require_workers(method_name)
        return [
            self._execute_rank_async(rank, method_name, a, k)
            for rank, (a, k) in enumerate(self._per_rank_arguments(args, kwargs))
        ]

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Start ``method_name`` on rank 0 only; return its backend handle."""
        self._require_workers(method_name)
        return self._execute_rank_async(0, method_name, args, kwargs)

    def _route(
        self, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any], rank_zero: bool
    ) -> tuple[str, tuple[Any, ...]]:
        """The worker method a bound call runs, and its positional arguments: in a group
        made by :meth:`spawn_fused`, ``_fuw_execute`` with ``"{role}_fwmn_{method}"`` first
        (one copy per rank when the arguments are per-rank lists)."""
        if self._fused_role is None:
            return method_name, args
        target = f"{self._fused_role}{FUSED_METHOD_SEPARATOR}{method_name}"
        per_rank = not rank_zero and self._is_per_rank(args, kwargs)
        first: Any = [target] * self.world_size if per_rank else target
        return self.fused_worker_execute_fn_name, (first, *args)

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method_name`` on every rank and return the per-rank results."""
        call = self._new_call(method_name, Execute.ALL, True, self.default_timeout)
        return self._run_raw(call, lambda: self.execute_all_async(method_name, *args, **kwargs))

    def execute_rank_zero_sync(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method_name`` on rank 0 and return its result."""
        call = self._new_call(method_name, Execute.RANK_ZERO, True, self.default_timeout)
        return self._run_raw(
            call, lambda: [self.execute_rank_zero_async(method_name, *args, **kwargs)]
        )[0]

    def execute_all(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Same as :meth:`execute_all_async` (verl's alias): one backend handle per rank."""
        return self.execute_all_async(method_name, *args, **kwargs)

    def execute_rank_zero(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Same as :meth:`execute_rank_zero_async` (verl's alias): rank 0's backend handle."""
        return self.execute_rank_zero_async(method_name, *args, **kwargs)

    def _run_raw(self, call: Call, start: Callable[[], list[Any]]) -> list[Any]:
        with self._running(call):
            with call.span.phase("execute"):
                handles = start()
            with call.span.phase("wait"):
                return self._checked_wait(handles, call)

    @contextlib.contextmanager
    def _running(self, call: Call) -> Iterator[None]:
        """Make ``call`` current, refuse it if it touches dead ranks, and finish its span
        (with the error, if any) when it ends."""
        error: BaseException | None = None
        waiting_behind = self._liveness.busy.current(self._handle_done, call.ranks)
        if waiting_behind:
            logger.warning(
                "worker group %s: %s waits on ranks %s, %s",
                self.name_prefix,
                call.method_name,
                sorted(waiting_behind),
                describe_busy(waiting_behind),
            )
        try:
            with active_call(call):
                self._check_alive(call)
                yield
        except BaseException as exc:
            error = exc
            if waiting_behind and isinstance(exc, CallTimeoutError):
                _add_note(
                    exc,
                    f"When this call started, ranks {sorted(waiting_behind)} were "
                    f"{describe_busy(waiting_behind)}.",
                )
            raise
        finally:
            call.span.finish(error)

    # --- binding -----------------------------------------------------------------------

    def _bind_worker_method(
        self, user_defined_cls: type, func_generator: Callable[..., Any] | None = None
    ) -> list[str]:
        """Bind one proxy per ``@register``-ed method of ``user_defined_cls``.

        With ``func_generator`` (verl's hook) the bound object is
        ``func_generator(self, method_name, dispatch_fn=..., collect_fn=..., execute_fn=...,
        blocking=...)`` instead of a :class:`MethodProxy`. A name already taken on the group
        is a :class:`~sc_core.MethodCollisionError`. Returns the bound names.
        """
        if not isinstance(user_defined_cls, type):
            raise ConfigTypeError(
                f"{type(self).__name__}._bind_worker_method: expected a class, "
                f"got {type(user_defined_cls).__qualname__} {user_defined_cls!r}"
            )
        self._user_defined_cls = user_defined_cls
        bound: list[str] = []
        for method_name in dir(user_defined_cls):
            try:
                method = getattr(user_defined_cls, method_name)
            except Exception:  # a descriptor that fails on the class is no registered method
                continue
            attrs = get_register_attrs(method) if callable(method) else None
            if attrs is None:
                continue
            spec = resolve_dispatch_mode(attrs.dispatch_mode)
            execute_fn_name = get_predefined_execute_fn(attrs.execute_mode)["execute_fn_name"]
            proxy: Any
            if func_generator is None:
                proxy = MethodProxy(
                    self,
                    method_name,
                    method_name,
                    attrs,
                    spec,
                    doc=getattr(method, "__doc__", None),
                )
            else:
                proxy = func_generator(
                    self,
                    method_name,
                    dispatch_fn=spec.dispatch_fn,
                    collect_fn=spec.collect_fn,
                    execute_fn=getattr(self, execute_fn_name),
                    blocking=attrs.blocking,
                )
            self._set_bound_method(method_name, proxy, source=user_defined_cls)
            bound.append(method_name)
        return bound

    def _set_bound_method(
        self, name: str, proxy: Any, *, source: type | None = None, replace: bool = False
    ) -> None:
        taken = name not in self._bound_methods and (
            name in self.__dict__ or hasattr(type(self), name)
        )
        if taken or (name in self._bound_methods and not replace):
            where = f"worker class {source.__qualname__}" if source is not None else "spawn"
            raise MethodCollisionError(
                f"{type(self).__name__}._bind_worker_method: {where} registers a method named "
                f"{name!r}, which is already an attribute of the worker group "
                f"({type(self).__name__}.{name}); rename the worker method"
            )
        setattr(self, name, proxy)
        self._bound_methods[name] = proxy

    def _unbind_all(self) -> None:
        """Remove every bound method from this group."""
        for name in self._bound_methods:
            self.__dict__.pop(name, None)
        self._bound_methods = {}

    @property
    def bound_method_names(self) -> list[str]:
        """The names of the bound worker methods, sorted."""
        return sorted(self._bound_methods)

    def method(self, func: RegisteredMethod[Any, Any, Q, C]) -> MethodProxy[Q, C]:
        """The bound proxy of a worker method, typed: ``wg.method(MyWorker.generate)``.

        ``func`` is a ``@register``-ed method (for the type checker a
        :class:`~sc_dispatch.RegisteredMethod`); the proxy takes the method's parameters
        (or, for per-rank modes such as ``DP_COMPUTE``, anything) and returns what the call
        collects: ``list[R]``, ``R``, or ``Any`` for non-blocking methods and modes the
        checker does not know (see :func:`sc_dispatch.register`). ``.options(...)`` keeps the
        types. A method that is not bound on this group is an
        :class:`~sc_core.UnknownMethodError`."""
        name = getattr(func, "__name__", None)
        proxy = self._bound_methods.get(name) if isinstance(name, str) else None
        if not isinstance(proxy, MethodProxy):
            raise UnknownMethodError(
                f"{type(self).__name__}.method: {func!r} is not a bound worker method; "
                f"bound: {self.bound_method_names}"
            )
        return cast("MethodProxy[Q, C]", proxy)

    def call(
        self, func: RegisteredMethod[Any, Any, Q, C], /, *args: Q.args, **kwargs: Q.kwargs
    ) -> C:
        """Call the bound worker method ``func`` with a type the checker knows, no plugin
        needed: ``wg.call(MyWorker.update_actor, batch)`` is ``wg.update_actor(batch)``.

        The arguments are checked against the worker method's parameters (except for
        per-rank modes, whose arguments are lists with one entry per rank), and the result
        is typed as the mode collects it: ``list[R]`` for ``ONE_TO_ALL``, ``R`` for
        ``DP_COMPUTE_PROTO``, ... (see :meth:`method`). ``func`` must be ``@register``-ed
        and bound on this group; for per-call options use
        ``wg.method(MyWorker.update_actor).options(timeout=30)(batch)``."""
        return self.method(func)(*args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name_prefix!r} world_size={self.world_size} "
            f"methods={len(self._bound_methods)}>"
        )

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: typos get a list of what exists.
        bound = self.__dict__.get("_bound_methods")
        if name.startswith("__") or bound is None:
            raise AttributeError(name)
        raise UnknownMethodError(
            f"{type(self).__name__} has no attribute or bound worker method {name!r}; "
            f"bound methods: {sorted(bound)}"
        )

    # --- one call ------------------------------------------------------------------------

    def _new_call(
        self,
        method_name: str,
        execute_mode: Execute,
        blocking: bool,
        timeout: float | None,
        joins_shards: bool = False,
    ) -> Call:
        ranks = (0,) if execute_mode is Execute.RANK_ZERO else tuple(range(self.world_size))
        return Call(
            group=self.name_prefix,
            method_name=method_name,
            ranks=ranks,
            execute_mode=execute_mode,
            blocking=blocking,
            timeout=timeout,
            joins_shards=joins_shards,
        )

    def _require_workers(self, method_name: str) -> None:
        if not self._workers:
            raise WorkerGroupError(
                f"{type(self).__name__}.{method_name}: the worker group has no workers"
            )

    def _call_method(
        self, proxy: MethodProxy[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Dispatch, execute, wait (or not) and collect one call of a bound method."""
        opts = proxy.call_options
        attrs = proxy.attrs
        spec = proxy.spec
        name = proxy.method_name
        blocking = attrs.blocking if opts.blocking is None else opts.blocking
        timeout = opts.timeout if opts.has_timeout else self.default_timeout
        rank_zero = attrs.execute_mode is Execute.RANK_ZERO
        self._require_workers(name)
        call = self._new_call(name, attrs.execute_mode, blocking, timeout, spec.joins_shards)
        with self._running(call):
            with call.span.phase("dispatch"):
                try:
                    d_args, d_kwargs = spec.dispatch_fn(self, *args, **kwargs)
                except DispatchError as exc:
                    _reraise_with_method(exc, proxy.__qualname__)
                d_kwargs = dict(d_kwargs)
                pad = pop_padding_size(d_kwargs)
            with call.span.phase("execute"):
                target, d_args = self._route(name, tuple(d_args), d_kwargs, rank_zero)
                if rank_zero:
                    handles = [self.execute_rank_zero_async(target, *d_args, **d_kwargs)]
                else:
                    handles = list(self.execute_all_async(target, *d_args, **d_kwargs))
            if blocking:
                with call.span.phase("wait"):
                    outputs = self._checked_wait(handles, call)
            else:
                outputs = self._pending_outputs(handles, call)
            with call.span.phase("collect"):
                try:
                    result = spec.collect_fn(self, outputs[0] if rank_zero else outputs)
                    if pad and spec.unpad_output:
                        result = unpad_output(result, pad)
                except DispatchError as exc:
                    _reraise_with_method(exc, proxy.__qualname__)
            return result

    def _checked_wait(self, handles: Sequence[Any], call: Call) -> list[Any]:
        try:
            outputs = self._wait(handles, call)
        except (CallTimeoutError, WorkerDiedError, WorkerError) as exc:
            self._give_up(call, handles, exc)
            raise
        if len(outputs) != len(handles):
            raise WorkerGroupError(
                f"{type(self).__name__}._wait returned {len(outputs)} outputs for "
                f"{len(handles)} handles in {call.method_name}"
            )
        return outputs

    def _give_up(self, call: Call, handles: Sequence[Any], exc: BaseException) -> None:
        """The group stops waiting for ``call``: cancel what the backend can, remember the
        ranks still running it, and say so in ``exc``'s message."""
        busy = self._liveness.busy
        for rank, handle in zip(call.ranks, handles, strict=False):
            if self._handle_done(handle):
                continue
            busy.record(rank, call.method_name, handle, self._cancel_handle(handle))
        still = busy.current(self._handle_done, call.ranks)
        if still:
            _add_note(exc, f"Ranks {sorted(still)} are {describe_busy(still)}.")
            logger.warning(
                "worker group %s: %s: ranks %s %s",
                self.name_prefix,
                call.method_name,
                sorted(still),
                describe_busy(still),
            )

    @property
    def busy_ranks(self) -> dict[int, AbandonedCall]:
        """The ranks still running a call the group gave up on (after a deadline, a worker
        death or another rank's failure), with what they run; their next call waits."""
        return self._liveness.busy.current(self._handle_done)

    # --- liveness ------------------------------------------------------------------------

    @property
    def dead_ranks(self) -> list[int]:
        """Ranks known to be dead, sorted."""
        with self._liveness.lock:
            return sorted(self._liveness.dead)

    def _mark_workers_dead(self, ranks: Iterable[int], reason: str = "") -> None:
        """Record dead ranks; later calls touching them raise WorkerDiedError at once."""
        with self._liveness.lock:
            for rank in ranks:
                self._liveness.dead.setdefault(rank, reason)

    def _check_alive(self, call: Call) -> None:
        with self._liveness.lock:
            dead = {r: self._liveness.dead[r] for r in call.ranks if r in self._liveness.dead}
        if dead:
            reasons = sorted(set(dead.values()) - {""})
            raise WorkerDiedError(call.method_name, list(dead), "; ".join(reasons))

    def check_worker_aliveness(self) -> list[int]:
        """Ask the backend about every rank not yet known dead; record and return the ranks
        found dead now."""
        known = set(self.dead_ranks)
        newly = [
            rank
            for rank, worker in enumerate(self._workers)
            if rank not in known and not self._is_worker_alive(worker)
        ]
        if newly:
            self._mark_workers_dead(newly, "found by the aliveness check")
        return newly

    def _block_until_all_workers_alive(self, timeout: float | None = None) -> None:
        """Wait until every worker is alive; :class:`WorkerDiedError` after ``timeout``
        seconds (default ``SC_WORKER_START_TIMEOUT``, else 300)."""
        if timeout is None:
            timeout = _env_float("SC_WORKER_START_TIMEOUT") or 300.0
        deadline = time.monotonic() + timeout
        while True:
            down = [r for r, w in enumerate(self._workers) if not self._is_worker_alive(w)]
            if not down:
                return
            if time.monotonic() >= deadline:
                raise WorkerDiedError(None, down, f"not alive {timeout}s after start")
            time.sleep(min(0.05, timeout))

    def start_worker_aliveness_check(
        self, every_n_seconds: float = 1, *, abort_on_death: bool | None = None
    ) -> None:
        """Check every ``every_n_seconds`` on a daemon thread whether the workers are alive.

        A dead worker is logged and recorded: the next call touching it raises
        :class:`~sc_core.WorkerDiedError`. With ``abort_on_death=True`` (or
        ``SC_ABORT_ON_WORKER_DEATH=1``) the driver is killed with SIGABRT instead, as verl
        does. Waits first until every worker is alive.
        """
        interval = check_timeout("start_worker_aliveness_check: every_n_seconds", every_n_seconds)
        abort = _env_flag("SC_ABORT_ON_WORKER_DEATH") if abort_on_death is None else abort_on_death
        liveness = self._liveness
        if liveness.thread is not None and liveness.thread.is_alive():
            return
        self._block_until_all_workers_alive()
        liveness.stop.clear()
        group_ref = weakref.ref(self)

        def loop() -> None:
            while not liveness.stop.wait(interval):
                group = group_ref()
                if group is None:
                    return
                newly = group.check_worker_aliveness()
                if newly:
                    logger.error(
                        "worker group %s: ranks %s are no longer alive", group.name_prefix, newly
                    )
                    if abort:
                        signal.raise_signal(signal.SIGABRT)
                if len(group.dead_ranks) == group.world_size:
                    return
                del group

        liveness.thread = threading.Thread(
            target=loop, name=f"sc-aliveness-{self.name_prefix}", daemon=True
        )
        liveness.thread.start()

    def stop_worker_aliveness_check(self) -> None:
        """Stop the thread started by :meth:`start_worker_aliveness_check`."""
        self._liveness.stop.set()
        thread = self._liveness.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._liveness.thread = None

    # --- colocation ------------------------------------------------------------------------

    def _shallow_copy(self: WG) -> WG:
        """A group sharing this group's workers, with its own mesh caches and the same
        proxies rebound to it. Backends override it to copy or reset their own state."""
        new = copy.copy(self)
        new._unbind_all()
        new._dispatch_info = {}
        new._collect_info = {}
        new.wg_dict = None
        # The group that owns the workers may close them when it is garbage-collected (the
        # local backend's finalizer does): a spawned group keeps it alive while in use.
        new._spawned_from = self
        for name, proxy in self._bound_methods.items():
            rebound = proxy._rebind(new, name) if isinstance(proxy, MethodProxy) else proxy
            new._set_bound_method(name, rebound)
        return new

    def spawn(self: WG, prefix_set: Iterable[str]) -> dict[str, WG]:
        """One group per role of a colocated worker class, sharing this group's workers.

        In the group of role ``r`` the role's methods (bound here as ``r_method``) are also
        bound under their plain names (``method``), as in verl.
        """
        roles: dict[str, dict[str, str]] | None = getattr(
            self._user_defined_cls, COLOCATED_METHODS_ATTR, None
        )
        if isinstance(prefix_set, str):
            raise ConfigTypeError(
                f"{type(self).__name__}.spawn: prefix_set must be a collection of role names, "
                f"got the string {prefix_set!r}"
            )
        result: dict[str, WG] = {}
        for prefix in prefix_set:
            if roles is not None:
                if prefix not in roles:
                    raise UnknownRoleError(
                        f"{type(self).__name__}.spawn: unknown role {prefix!r}; the colocated "
                        f"worker class has roles {sorted(roles)}"
                    )
                mapping = dict(roles[prefix])
            else:
                head = f"{prefix}_"
                mapping = {n[len(head) :]: n for n in self._bound_methods if n.startswith(head)}
                if not mapping:
                    raise UnknownRoleError(
                        f"{type(self).__name__}.spawn: no bound method starts with {head!r}; "
                        f"bound: {self.bound_method_names}"
                    )
            new = self._shallow_copy()
            for plain, prefixed in mapping.items():
                proxy = new._bound_methods[prefixed]
                alias = proxy._rebind(new, plain) if isinstance(proxy, MethodProxy) else proxy
                new._set_bound_method(plain, alias, replace=True)
            result[prefix] = new
        return result

    def spawn_fused(self: WG, prefix_set: Iterable[str]) -> dict[str, WG]:
        """One group per role of a fused worker class (``create_colocated_worker_cls_fused``).

        The group of role ``r`` binds the registered methods of ``r``'s own class under their
        plain names and sends every call through the fused worker's ``_fuw_execute``.
        """
        raw: dict[str, type] | None = getattr(self._user_defined_cls, "raw_cls_dict", None)
        if not getattr(self._user_defined_cls, "is_fused_worker", False) or raw is None:
            raise ConfigTypeError(
                f"{type(self).__name__}.spawn_fused: the worker class "
                f"{getattr(self._user_defined_cls, '__qualname__', None)} is not a fused "
                "worker; build it with create_colocated_worker_cls_fused"
            )
        if isinstance(prefix_set, str):
            raise ConfigTypeError(
                f"{type(self).__name__}.spawn_fused: prefix_set must be a collection of role "
                f"names, got the string {prefix_set!r}"
            )
        result: dict[str, WG] = {}
        for prefix in prefix_set:
            if prefix not in raw:
                raise UnknownRoleError(
                    f"{type(self).__name__}.spawn_fused: unknown role {prefix!r}; the fused "
                    f"worker class has roles {sorted(raw)}"
                )
            new = self._shallow_copy()
            new._unbind_all()
            new._fused_role = prefix
            new._bind_worker_method(raw[prefix])
            result[prefix] = new
        return result

    def fuse(self, prefix_set: Iterable[str]) -> None:
        """Make each role's :meth:`spawn_fused` group an attribute: ``wg.actor.update(...)``.

        A role named like an attribute of the group is a :class:`~sc_core.MethodCollisionError`.
        """
        if self.wg_dict is None:
            self.wg_dict = dict(self.spawn_fused(prefix_set))
        for role, group in self.wg_dict.items():
            if self.__dict__.get(role) is group:
                continue
            if role in self.__dict__ or hasattr(type(self), role):
                raise MethodCollisionError(
                    f"{type(self).__name__}.fuse: role {role!r} is already an attribute of the "
                    "worker group; rename the role"
                )
            setattr(self, role, group)


def _add_note(exc: BaseException, note: str) -> None:
    """Append ``note`` to ``exc``'s message (Python 3.10 has no ``add_note``)."""
    if note in str(exc):
        return
    first = str(exc.args[0]) if exc.args else ""
    exc.args = (f"{first}\n{note}" if first else note, *exc.args[1:])


def _reraise_with_method(exc: DispatchError, qualname: str) -> NoReturn:
    """Raise the same dispatch error with the bound method's name in front of its message."""
    try:
        renamed = type(exc)(f"{qualname}: {exc}")
    except Exception:  # an exotic subclass with another constructor: keep the original
        raise exc from None
    raise renamed from exc
