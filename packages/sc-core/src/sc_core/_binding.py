"""Binding: each ``@register``-ed method of a worker class becomes a method of the group.

verl binds by attribute, and so does sc: after binding, ``wg.generate`` is a
:class:`MethodProxy` stored on the group instance (or whatever verl's ``func_generator``
hook returned). Every binding goes through the group's
:class:`~sc_core._methods.MethodTable`, which refuses a name the group already uses.
Calling a proxy runs ``_call_path.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Generic, Literal, ParamSpec, TypeVar, cast, overload

from sc_dispatch.ext import (
    DispatchModeSpec,
    RegisterAttrs,
    get_register_attrs,
    resolve_dispatch_mode,
)
from sc_dispatch.verl import get_predefined_execute_fn

from ._call import CallOptions, check_timeout
from ._call_path import CallStream, call_method
from ._errors import ConfigTypeError
from ._runtime import GroupLike
from ._units import CallSite

__all__ = ["KEEP", "MethodProxy", "bind_worker_methods", "rebound"]

P = ParamSpec("P")
R = TypeVar("R")


class _Keep(enum.Enum):
    KEEP = "keep"


KEEP = _Keep.KEEP


class MethodProxy(Generic[P, R]):
    """A worker method bound on a worker group: calling it runs the distributed call.

    ``proxy.options(timeout=..., blocking=..., in_order=...)`` returns a proxy with per-call
    overrides; ``proxy.stream(...)`` runs the call and yields its shards as they finish.
    ``method_name`` is the name the workers run; ``__name__`` the name on the group (they
    differ for the plain-name aliases of :meth:`WorkerGroup.spawn`).
    """

    def __init__(
        self,
        group: CallSite,
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
        return cast("R", call_method(self._group, self, args, kwargs))

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> CallStream[R]:
        """Run the call and yield ``(rows, shard)`` as each shard finishes: ``rows`` are
        the positions of the shard's rows in the input batch, ``shard`` the method's output
        for them (padding dropped). Completion order, or input order after
        ``.options(in_order=True)``; ``.result()`` on the stream joins every shard, as a
        blocking call does. Needs a mode that cuts the batch into units
        (:class:`~sc_core.UnsupportedCallError` otherwise); the call's timeout covers the
        whole stream, and a worker failure raises the blocking call's typed error."""
        in_order = self.call_options.in_order
        return CallStream(self._group, self, args, kwargs, in_order=in_order)

    @overload
    def options(
        self,
        *,
        timeout: float | _Keep | None = KEEP,
        in_order: bool | _Keep = KEEP,
        blocking: Literal[True] | _Keep = KEEP,
    ) -> MethodProxy[P, R]: ...

    @overload
    def options(
        self,
        *,
        timeout: float | _Keep | None = KEEP,
        in_order: bool | _Keep = KEEP,
        blocking: bool | _Keep | None = KEEP,
    ) -> MethodProxy[P, Any]: ...

    def options(
        self,
        *,
        timeout: float | _Keep | None = KEEP,
        in_order: bool | _Keep = KEEP,
        blocking: bool | _Keep | None = KEEP,
    ) -> MethodProxy[P, Any]:
        """A proxy whose calls use ``timeout`` seconds (``None``: no limit) and ``blocking``
        instead of the defaults, and whose streams yield in input order when ``in_order``;
        arguments left out keep their current setting.

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
        if in_order is not KEEP:
            if not isinstance(in_order, bool):
                raise ConfigTypeError(
                    f"{where}: in_order must be a bool, "
                    f"got {type(in_order).__qualname__} {in_order!r}"
                )
            opts = replace(opts, in_order=in_order)
        return self.rebind(self._group, self.__name__, opts)

    def rebind(
        self, group: CallSite, name: str, options: CallOptions | None = None
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


def bind_worker_methods(
    group: GroupLike, user_defined_cls: type, func_generator: Callable[..., Any] | None = None
) -> list[str]:
    """Bind one proxy per ``@register``-ed method of ``user_defined_cls`` on ``group``.

    With ``func_generator`` (verl's hook) the bound object is
    ``func_generator(group, method_name, dispatch_fn=..., collect_fn=..., execute_fn=...,
    blocking=...)`` instead of a :class:`MethodProxy`. Returns the bound names.
    """
    where = f"{type(group).__name__}._bind_worker_method"
    if not isinstance(user_defined_cls, type):
        raise ConfigTypeError(
            f"{where}: expected a class, "
            f"got {type(user_defined_cls).__qualname__} {user_defined_cls!r}"
        )
    group._user_defined_cls = user_defined_cls
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
        # an execute mode without an execute function fails here, at binding
        execute_fn_name = get_predefined_execute_fn(attrs.execute_mode)["execute_fn_name"]
        proxy: Any
        if func_generator is None:
            proxy = MethodProxy(
                group, method_name, method_name, attrs, spec, doc=getattr(method, "__doc__", None)
            )
        else:
            proxy = func_generator(
                group,
                method_name,
                dispatch_fn=spec.dispatch_fn,
                collect_fn=spec.collect_fn,
                execute_fn=getattr(group, execute_fn_name),
                blocking=attrs.blocking,
            )
        group._sc_methods.bind(method_name, proxy, source=user_defined_cls)
        bound.append(method_name)
    return bound


def rebound(group: CallSite) -> Callable[[Any, str], Any]:
    """How a view rebinds its parent's bound objects: a proxy re-pointed at ``group``
    (other bound objects, from verl's ``func_generator``, as they are)."""

    def rebind(proxy: Any, name: str) -> Any:
        return proxy.rebind(group, name) if isinstance(proxy, MethodProxy) else proxy

    return rebind
