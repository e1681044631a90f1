"""Colocation: several worker roles in one worker process, shared by every backend.

:func:`create_colocated_worker_cls` wraps, in a :class:`~sc_core.ClassWithInitArgs`, verl's
*WorkerDict* class: one instance per role in ``self.worker_dict``, each role's registered
methods exposed as ``{role}_{method}`` with the same register attributes (``async`` methods
stay ``async``). A worker group of it runs every role on the same workers;
:meth:`~sc_core.WorkerGroup.spawn` then gives one group per role with plain method names
(:func:`spawn`, :func:`shallow_copy` and :func:`fuse` here hold the logic of the group's
methods). verl's *fused* classes, which reach a role through ``_fuw_execute``, are in
``_fused.py``. Backends that wrap user classes (``ray.remote``) register an unwrapper with
:func:`register_class_unwrapper`, so that sc-core finds the user's class without knowing
the backend's names.
"""

from __future__ import annotations

import copy
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from sc_dispatch.ext import MAGIC_ATTR, get_register_attrs

# Referenced through its module, never imported by name: a colocated class is built at run
# time, and Ray ships it by value with the globals its methods use. A module pickles by
# reference; a ContextVar does not pickle at all.
from . import _context
from ._binding import MethodProxy, rebound
from ._errors import ColocationError, ConfigTypeError, MethodCollisionError, UnknownRoleError
from ._meshes import MeshCache
from ._methods import MethodTable
from ._resource import ClassWithInitArgs
from ._runtime import GroupLike
from ._worker import Worker

__all__ = [
    "COLOCATED_METHODS_ATTR",
    "check_class_dict",
    "check_prefix_set",
    "create_colocated_worker_cls",
    "fuse",
    "register_class_unwrapper",
    "shallow_copy",
    "spawn",
    "unwrap_worker_cls",
]

#: Attribute of a colocated worker class mapping each role to ``{plain: prefixed}`` names.
COLOCATED_METHODS_ATTR = "__sc_colocated_methods__"

WG = TypeVar("WG", bound=GroupLike)

_unwrappers_lock = threading.Lock()
_unwrappers: tuple[Callable[[Any], Any], ...] = ()


def register_class_unwrapper(unwrap: Callable[[Any], Any]) -> None:
    """Teach sc-core a backend's class wrapper: ``unwrap(obj)`` returns the user class
    behind ``obj``, or ``None`` when ``obj`` is not such a wrapper (sc-ray registers one for
    ``ray.remote`` classes). Registering the same function twice does nothing."""
    global _unwrappers
    if not callable(unwrap):
        raise ConfigTypeError(
            f"register_class_unwrapper: expected a callable, got {type(unwrap).__qualname__}"
        )
    with _unwrappers_lock:
        if unwrap not in _unwrappers:
            _unwrappers = (*_unwrappers, unwrap)


def unwrap_worker_cls(cls: Any) -> Any:
    """The user class behind a registered backend wrapper, or ``cls`` itself."""
    for unwrap in _unwrappers:
        inner = unwrap(cls)
        if inner is not None:
            return inner
    return cls


def _forwarder(role: str, name: str, is_async: bool, raw_attrs: Mapping[str, Any]) -> Any:
    """A method of the colocated class calling ``self.worker_dict[role].name``."""
    if is_async:

        async def forward_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self.worker_dict[role], name)(*args, **kwargs)

        func: Callable[..., Any] = forward_async
    else:

        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.worker_dict[role], name)(*args, **kwargs)

        func = forward
    func.__name__ = func.__qualname__ = f"{role}_{name}"
    func.__doc__ = f"Role {role!r}: forwards to {name}."
    setattr(func, MAGIC_ATTR, dict(raw_attrs))
    return func


def check_class_dict(
    where: str, class_dict: Mapping[str, ClassWithInitArgs[Any]]
) -> dict[str, tuple[type, ClassWithInitArgs[Any]]]:
    """Role name -> (user class, its ClassWithInitArgs), validated."""
    if not isinstance(class_dict, Mapping):
        raise ConfigTypeError(
            f"{where}: class_dict must be a mapping of role name to ClassWithInitArgs, "
            f"got {type(class_dict).__qualname__} {class_dict!r}"
        )
    if not class_dict:
        raise ColocationError(f"{where}: class_dict is empty; give at least one role")
    roles: dict[str, tuple[type, ClassWithInitArgs[Any]]] = {}
    for role, cia in class_dict.items():
        if not isinstance(role, str):
            raise ConfigTypeError(
                f"{where}: role names must be str, got {type(role).__qualname__} {role!r}"
            )
        if not role.isidentifier():
            raise ColocationError(f"{where}: role names must be identifiers, got {role!r}")
        if not isinstance(cia, ClassWithInitArgs):
            raise ConfigTypeError(
                f"{where}: role {role!r} must map to a ClassWithInitArgs, "
                f"got {type(cia).__qualname__}"
            )
        user_cls = unwrap_worker_cls(cia.cls)
        if not isinstance(user_cls, type) or not issubclass(user_cls, Worker):
            shown = getattr(user_cls, "__qualname__", repr(user_cls))
            raise ConfigTypeError(
                f"{where}: role {role!r} runs {shown}, which is not a subclass of "
                "sc_core.Worker; colocated roles must be Worker classes"
            )
        roles[role] = (user_cls, cia)
    return roles


def _create_worker_dict_cls(
    class_dict: Mapping[str, ClassWithInitArgs[Any]],
) -> type[Worker]:
    """The WorkerDict class of :func:`create_colocated_worker_cls`: one worker class running
    every role of ``class_dict`` (role name → class with args), each role's registered
    methods exposed as ``{role}_{method}``.

    The class's ``__init__`` (no arguments) builds each role's instance with its own
    arguments, in the same worker environment. Role names must be identifiers; two roles
    exposing the same ``{role}_{method}`` name, or one clashing with a ``Worker`` attribute,
    is a :class:`~sc_core.ColocationError`.
    """
    roles = check_class_dict("create_colocated_worker_cls", class_dict)
    namespace: dict[str, Any] = {}
    method_map: dict[str, dict[str, str]] = {}
    owners: dict[str, str] = {}
    for role, (user_cls, _) in roles.items():
        method_map[role] = {}
        for name in dir(user_cls):
            try:
                method = getattr(user_cls, name)
            except Exception:
                continue
            if not callable(method) or get_register_attrs(method) is None:
                continue
            exposed = f"{role}_{name}"
            if exposed in owners:
                raise ColocationError(
                    f"create_colocated_worker_cls: {exposed!r} is exposed by role {role!r} "
                    f"(method {name!r}) and by role {owners[exposed]!r}; rename a role"
                )
            if hasattr(Worker, exposed):
                raise ColocationError(
                    f"create_colocated_worker_cls: role {role!r} method {name!r} would be "
                    f"exposed as {exposed!r}, which is a Worker attribute; rename the role"
                )
            owners[exposed] = role
            namespace[exposed] = _forwarder(
                role, name, inspect.iscoroutinefunction(method), getattr(method, MAGIC_ATTR)
            )
            method_map[role][name] = exposed

    def __init__(self: Any) -> None:
        Worker.__init__(self)
        self.worker_dict = {}
        token = _context._skip_rendezvous.set(True)
        try:
            for role, (user_cls, cia) in roles.items():
                self.worker_dict[role] = user_cls(*cia.args, **cia.kwargs)
        finally:
            _context._skip_rendezvous.reset(token)

    namespace["__init__"] = __init__
    namespace["_sc_framework_class"] = True
    namespace[COLOCATED_METHODS_ATTR] = method_map
    namespace["__doc__"] = f"Colocated worker running roles {sorted(roles)}."
    cls = type("WorkerDict", (Worker,), namespace)
    cls.__qualname__ = f"WorkerDict[{','.join(roles)}]"
    return cls


def create_colocated_worker_cls(
    class_dict: Mapping[str, ClassWithInitArgs[Any]],
) -> ClassWithInitArgs[Worker]:
    """verl's (older) colocated class, ready for a worker group's constructor: a
    :class:`~sc_core.ClassWithInitArgs` (no arguments) of a ``WorkerDict`` class running every
    role of ``class_dict`` (role name → class with args) in one worker.

    Each role's registered methods are exposed as ``{role}_{method}`` with the same register
    attributes (``async`` methods stay ``async``); the role instances are in
    ``self.worker_dict``. :meth:`~sc_core.WorkerGroup.spawn` gives one group per role with
    the plain names. Role names must be identifiers; two roles exposing the same
    ``{role}_{method}`` name, or one clashing with a ``Worker`` attribute, is a
    :class:`~sc_core.ColocationError`; a role that is not a ``Worker`` class is a
    :class:`~sc_core.ConfigTypeError`.
    """
    return ClassWithInitArgs(_create_worker_dict_cls(class_dict))


# --- one group per role -------------------------------------------------------------------


def check_prefix_set(where: str, prefix_set: Iterable[str]) -> None:
    if isinstance(prefix_set, str):
        raise ConfigTypeError(
            f"{where}: prefix_set must be a collection of role names, got the string {prefix_set!r}"
        )


def shallow_copy(group: WG) -> WG:
    """A view of ``group``: the same runtime (workers, backend, liveness, lifecycle), its own
    table of bound methods (``group``'s rebound to it) and mesh caches. It keeps ``group``
    alive while in use (a backend may close its workers when the group that owns them is
    garbage-collected)."""
    new = copy.copy(group)
    attributes = vars(new)
    for name in group._sc_methods:
        attributes.pop(name, None)
    new._sc_methods = MethodTable(new)
    new._mesh_cache = MeshCache()
    new.wg_dict = None
    new._spawned_from = group
    group._sc_runtime.views.add(new)
    new._sc_methods.bind_from(group._sc_methods, rebound(new))
    return new


def spawn(group: WG, prefix_set: Iterable[str]) -> dict[str, WG]:
    """One group per role of a colocated worker class, sharing ``group``'s workers; in the
    group of role ``r`` the role's methods (bound as ``r_method``) are also bound under their
    plain names (``method``), as in verl. (A fused group's ``spawn`` is
    ``_fused.spawn_fused``: :meth:`WorkerGroup.spawn` routes it.)"""
    where = f"{type(group).__name__}.spawn"
    roles: dict[str, dict[str, str]] | None = getattr(
        group._user_defined_cls, COLOCATED_METHODS_ATTR, None
    )
    check_prefix_set(where, prefix_set)
    result: dict[str, WG] = {}
    for prefix in prefix_set:
        if roles is not None:
            if prefix not in roles:
                raise UnknownRoleError(
                    f"{where}: unknown role {prefix!r}; the colocated worker class has roles "
                    f"{sorted(roles)}"
                )
            mapping = dict(roles[prefix])
        else:
            head = f"{prefix}_"
            mapping = {n[len(head) :]: n for n in group._sc_methods if n.startswith(head)}
            if not mapping:
                raise UnknownRoleError(
                    f"{where}: no bound method starts with {head!r}; "
                    f"bound: {group.bound_method_names}"
                )
        new = shallow_copy(group)
        for plain, prefixed in mapping.items():
            proxy = new._sc_methods.get(prefixed)
            alias = proxy.rebind(new, plain) if isinstance(proxy, MethodProxy) else proxy
            new._sc_methods.bind(plain, alias, replace=True)
        result[prefix] = new
    return result


def fuse(group: GroupLike, prefix_set: Iterable[str]) -> None:
    """Make each role's group of ``group.spawn(prefix_set)`` an attribute of ``group`` (for
    a fused group, ``_fused.spawn_fused``'s groups, as in verl); the groups are made once and
    kept in ``group.wg_dict``. A role named like an attribute of the group is a
    :class:`~sc_core.MethodCollisionError`."""
    if group.wg_dict is None:
        group.wg_dict = dict(group.spawn(prefix_set))
    for role, member in group.wg_dict.items():
        attributes = vars(group)
        if attributes.get(role) is member:
            continue
        if role in attributes or hasattr(type(group), role):
            raise MethodCollisionError(
                f"{type(group).__name__}.fuse: role {role!r} is already an attribute of the "
                "worker group; rename the role"
            )
        setattr(group, role, member)
