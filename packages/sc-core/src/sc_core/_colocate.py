"""Colocation: several worker roles in one worker process, shared by every backend.

:func:`create_colocated_worker_raw_cls` builds one :class:`~sc_core.Worker` class holding
one instance per role (in ``self.worker_dict``) and exposing each role's registered methods
as ``{role}_{method}`` with the same register attributes (``async`` methods stay ``async``).
A worker group of that class runs every role on the same workers;
:meth:`~sc_core.WorkerGroup.spawn` then gives one group per role with plain method names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from sc_dispatch import MAGIC_ATTR, get_register_attrs

# Referenced through its module, never imported by name: a colocated class is built at run
# time, and Ray ships it by value with the globals its methods use. A module pickles by
# reference; a ContextVar does not pickle at all.
from . import _context
from ._errors import ColocationError, ConfigTypeError, UnknownRoleError
from ._resource import ClassWithInitArgs
from ._worker import Worker
from ._worker_group import COLOCATED_METHODS_ATTR, FUSED_METHOD_SEPARATOR

__all__ = [
    "FUSED_METHOD_SEPARATOR",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
]


def unwrap_worker_cls(cls: Any) -> Any:
    """The user class behind a backend's wrapper (a ``ray.remote`` class keeps it in
    ``__ray_actor_class__``), or ``cls`` itself."""
    inner = getattr(cls, "__ray_actor_class__", None)
    return inner if inner is not None else cls


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


def _check_class_dict(
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


def create_colocated_worker_raw_cls(
    class_dict: Mapping[str, ClassWithInitArgs[Any]],
) -> type[Worker]:
    """One worker class running every role of ``class_dict`` (role name → class with args).

    The class's ``__init__`` (no arguments) builds each role's instance with its own
    arguments, in the same worker environment. Role names must be identifiers; two roles
    exposing the same ``{role}_{method}`` name, or one clashing with a ``Worker`` attribute,
    is a :class:`~sc_core.ColocationError`.
    """
    roles = _check_class_dict("create_colocated_worker_cls", class_dict)
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
    """:func:`create_colocated_worker_raw_cls` wrapped in a :class:`~sc_core.ClassWithInitArgs`
    (no arguments), ready for a worker group's constructor."""
    return ClassWithInitArgs(create_colocated_worker_raw_cls(class_dict))


def create_colocated_worker_cls_fused(
    class_dict: Mapping[str, ClassWithInitArgs[Any]],
) -> type[Worker]:
    """verl's fused variant: one worker class holding one instance per role.

    Each role instance is ``self.<role>`` and ``self.fused_worker_dict[role]``, and every role
    instance's ``fused_worker_dict`` is that same mapping, so roles can reach each other.
    Nothing is exposed as ``{role}_{method}``: calls reach a role through
    ``_fuw_execute("{role}_fwmn_{method}", *args, **kwargs)``, which the groups made by
    :meth:`~sc_core.WorkerGroup.spawn_fused` and :meth:`~sc_core.WorkerGroup.fuse` send. The
    class has ``is_fused_worker = True`` and ``raw_cls_dict`` (role name → user class).
    A role named like a ``Worker`` attribute is a :class:`~sc_core.ColocationError`.
    """
    where = "create_colocated_worker_cls_fused"
    roles = _check_class_dict(where, class_dict)
    for role in roles:
        if hasattr(Worker, role):
            raise ColocationError(
                f"{where}: role {role!r} is the name of a Worker attribute; rename the role"
            )
    raw_cls_dict = {role: user_cls for role, (user_cls, _) in roles.items()}

    def __init__(self: Any) -> None:
        Worker.__init__(self)
        token = _context._skip_rendezvous.set(True)
        try:
            for role, (user_cls, cia) in roles.items():
                instance = user_cls(*cia.args, **cia.kwargs)
                self.fused_worker_dict[role] = instance
                setattr(self, role, instance)
        finally:
            _context._skip_rendezvous.reset(token)
        for instance in self.fused_worker_dict.values():
            setattr(instance, Worker.fused_worker_attr_name, self.fused_worker_dict)

    def _fuw_execute(self: Any, method_name: str, *args: Any, **kwargs: Any) -> Any:
        role, sep, name = method_name.partition(FUSED_METHOD_SEPARATOR)
        if not sep or role not in self.fused_worker_dict:
            raise UnknownRoleError(
                f"{type(self).__qualname__}._fuw_execute (rank {self._rank}): expected "
                f"'<role>{FUSED_METHOD_SEPARATOR}<method>' with a role in "
                f"{sorted(self.fused_worker_dict)}, got {method_name!r}"
            )
        return getattr(self.fused_worker_dict[role], name)(*args, **kwargs)

    name = "_".join(["FusedWorker", *roles])
    return type(
        name,
        (Worker,),
        {
            "__init__": __init__,
            "_fuw_execute": _fuw_execute,
            "is_fused_worker": True,
            "raw_cls_dict": raw_cls_dict,
            "_sc_framework_class": True,
            "__doc__": f"Fused worker running roles {sorted(roles)}.",
        },
    )
