"""A mypy plugin that types the bound worker methods of a worker group.

Enable it in the mypy configuration::

    [tool.mypy]
    plugins = ["sc_core.mypy_plugin"]

A worker group binds each ``@register``-ed method of its worker class at run time, so
without the plugin ``wg.update_actor`` is ``Any`` (it comes from ``WorkerGroup.__getattr__``).
With it, for a group whose worker class the checker knows (``WorkerGroup[MyWorker]``,
inferred from ``LocalWorkerGroup(pool, ClassWithInitArgs(MyWorker))`` or written in an
annotation), ``wg.update_actor`` is a :class:`~sc_core.MethodProxy` with the worker
method's parameters and the type the call collects, read from the method's ``@register``
arguments through the types :func:`sc_dispatch.register` gives them:

- ``ONE_TO_ALL``, ``DP_COMPUTE_METRIC``: ``list[R]`` (``R`` the method's return type, or
  what its coroutine returns);
- ``RANK_ZERO``, ``DP_COMPUTE_PROTO``, ``DP_COMPUTE_PROTO_WITH_FUNC``, N-d mesh modes:
  ``R``;
- ``ALL_TO_ALL``, ``DP_COMPUTE``: ``list[R]``, with unchecked (per-rank) arguments;
- custom modes wrapped in ``CollectsList`` / ``CollectsResult`` /
  ``PerRankCollectsList``: as declared;
- a custom mode written as a mapping in the decorator,
  ``@register(dispatch_mode={"dispatch_fn": d, "collect_fn": c})``: the declared return type
  of ``c``, with unchecked arguments (plugin only; ``Any`` when ``c`` is not annotated);
- non-blocking methods, other custom modes, an explicit ``execute_mode``: ``Any``.

A name that is not a registered method of a known worker class is an error
(``[attr-defined]``), as it is at run time (``UnknownMethodError``). Where the worker class
is ``Any``, or ``Worker`` itself (colocated and fused classes built at run time), the
plugin leaves the attribute ``Any``.
"""

from __future__ import annotations

from collections.abc import Callable

from mypy.errorcodes import ATTR_DEFINED
from mypy.maptype import map_instance_to_supertype
from mypy.nodes import (
    ARG_STAR,
    ARG_STAR2,
    CallExpr,
    Decorator,
    DictExpr,
    Expression,
    FuncDef,
    MemberExpr,
    NameExpr,
    StrExpr,
    TypeInfo,
    Var,
)
from mypy.plugin import AttributeContext, Plugin
from mypy.types import (
    AnyType,
    CallableType,
    Instance,
    Parameters,
    ProperType,
    Type,
    TypeOfAny,
    get_proper_type,
)

__all__ = ["ScCorePlugin", "plugin"]

_WORKER_GROUP = "sc_core._worker_group.WorkerGroup"
_METHOD_PROXY = "sc_core.MethodProxy"  # looked up by its public name
_WORKER = "sc_core._worker.Worker"
_REGISTERED = "sc_dispatch._typed.RegisteredMethod"


class ScCorePlugin(Plugin):
    """Types ``wg.<method>`` on worker groups (see the module docstring)."""

    def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
        # mypy asks with "<class defining __getattr__>.<name>" for names that normal lookup
        # does not find; WorkerGroup defines __getattr__.
        owner, _, name = fullname.rpartition(".")
        if owner == _WORKER_GROUP and name and not name.startswith("__"):
            return lambda ctx: _bound_method_type(ctx, name)
        return None


def _bound_method_type(ctx: AttributeContext, name: str) -> Type:
    group = get_proper_type(ctx.type)
    if not isinstance(group, Instance):
        return ctx.default_attr_type
    base = _find_base(group.type, _WORKER_GROUP)
    if base is None or group.type.get(name) is not None:
        # mypy also asks about the group's own attributes (world_size, ...): leave them.
        return ctx.default_attr_type
    (worker,) = map_instance_to_supertype(group, base).args or (None,)
    worker = get_proper_type(worker)
    if not isinstance(worker, Instance) or worker.type.fullname == _WORKER:
        return ctx.default_attr_type
    node = worker.type.get(name)
    where = f'"{group.type.name}[{worker.type.name}]"'
    if node is None:
        ctx.api.fail(
            f'{where} has no bound worker method "{name}": {worker.type.name} registers no '
            "method of that name",
            ctx.context,
            code=ATTR_DEFINED,
        )
        return AnyType(TypeOfAny.from_error)
    method_type = _declared_type(node.node)
    registered = None if method_type is None else _find_base(method_type.type, _REGISTERED)
    if method_type is None or registered is None:
        if isinstance(node.node, Decorator) and node.node.var.type is None:
            # Not inferred yet (the worker class is checked later): try again later.
            defer = getattr(ctx.api, "handle_cannot_determine_type", None)
            if defer is not None:
                defer(name, ctx.context)
            return AnyType(TypeOfAny.special_form)
        if isinstance(node.node, Decorator) and _has_register(node.node):
            # Registered, but typed some other way (another decorator around it): unknown.
            return ctx.default_attr_type
        ctx.api.fail(
            f'{where} has no bound worker method "{name}": '
            f"{worker.type.name}.{name} is not @register-ed",
            ctx.context,
            code=ATTR_DEFINED,
        )
        return AnyType(TypeOfAny.from_error)
    args = map_instance_to_supertype(method_type, registered).args
    if len(args) != 4:  # pragma: no cover - RegisteredMethod[P, R, Q, C]
        return ctx.default_attr_type
    call_params, collected = args[2], args[3]
    if isinstance(get_proper_type(collected), AnyType) and isinstance(node.node, Decorator):
        # A custom mode written in the decorator: its collect_fn's return annotation.
        declared = _collect_fn_return(node.node)
        if declared is not None:
            call_params, collected = _any_parameters(), declared
    named_generic_type = getattr(ctx.api, "named_generic_type", None)
    if named_generic_type is None:  # pragma: no cover - mypy's checker always has it
        return ctx.default_attr_type
    proxy: Instance = named_generic_type(_METHOD_PROXY, [call_params, collected])
    return proxy


def _collect_fn_return(node: Decorator) -> Type | None:
    """For ``@register(dispatch_mode={"dispatch_fn": ..., "collect_fn": f})`` with every
    other argument left at its default: the declared return type of ``f`` (a function, or a
    name of one), unless it is ``Any``."""
    for expr in node.original_decorators:
        if not (isinstance(expr, CallExpr) and _has_register_name(expr.callee)):
            continue
        mode = None
        for i, (arg, arg_name) in enumerate(zip(expr.args, expr.arg_names, strict=True)):
            if arg_name == "dispatch_mode" or (arg_name is None and i == 0):
                mode = arg
            elif arg_name != "materialize_futures":
                return None  # execute_mode / blocking given: not a blocking default call
        if not isinstance(mode, DictExpr):
            return None
        for key, value in mode.items:
            if isinstance(key, StrExpr) and key.value == "collect_fn":
                return _declared_return(value)
    return None


def _declared_return(expr: Expression) -> Type | None:
    target = expr.node if isinstance(expr, (NameExpr, MemberExpr)) else None
    if isinstance(target, Decorator):
        target = target.func
    if not isinstance(target, FuncDef):
        return None
    sig = get_proper_type(target.type)
    if not isinstance(sig, CallableType):
        return None
    ret = get_proper_type(sig.ret_type)
    return None if isinstance(ret, AnyType) else sig.ret_type


def _any_parameters() -> Parameters:
    """``(*args: Any, **kwargs: Any)``: the arguments of a custom mode are not checked."""
    any_type = AnyType(TypeOfAny.special_form)
    return Parameters([any_type, any_type], [ARG_STAR, ARG_STAR2], [None, None])


def _declared_type(node: object) -> Instance | None:
    """The static type of a class member, when it is an instance type (a registered
    method's is ``RegisteredMethod[...]``)."""
    typ: ProperType | None = None
    if isinstance(node, Decorator) and node.var.type is not None:
        typ = get_proper_type(node.var.type)
    elif isinstance(node, Var) and node.type is not None:
        typ = get_proper_type(node.type)
    return typ if isinstance(typ, Instance) else None


def _has_register(node: Decorator) -> bool:
    """Whether one of the method's decorators is a call of something named ``register``."""
    return any(
        _has_register_name(expr.callee if isinstance(expr, CallExpr) else expr)
        for expr in node.original_decorators
    )


def _has_register_name(expr: Expression) -> bool:
    return isinstance(expr, (NameExpr, MemberExpr)) and expr.name == "register"


def _find_base(info: TypeInfo, fullname: str) -> TypeInfo | None:
    for base in info.mro:
        if base.fullname == fullname:
            return base
    return None


def plugin(version: str) -> type[Plugin]:
    """mypy's entry point."""
    return ScCorePlugin
