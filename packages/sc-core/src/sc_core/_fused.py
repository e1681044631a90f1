"""verl's fused colocation: one worker class holding one instance per role, reached through
``_fuw_execute("{role}_fwmn_{method}", ...)``.

:func:`create_colocated_worker_raw_cls` builds the fused class (``FusedWorker_<roles>``:
``self.<role>``, ``fused_worker_dict``, ``is_fused_worker``, ``raw_cls_dict``), which users
may subclass with registered methods of their own;
:func:`create_colocated_worker_cls_fused` wraps it in a
:class:`~sc_core.ClassWithInitArgs` whose ``fused_worker_used`` is ``True``.
:func:`spawn_fused` gives one group per role, each binding its role's methods and calling
them through ``_fuw_execute``; :meth:`~sc_core.WorkerGroup.spawn` of a fused group
(:func:`is_fused_group`) routes here. The trainer does not use fused workers: they are
verl's, kept off the plain colocation path (``_colocate.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

# Referenced through its module, never imported by name: the fused class is built at run
# time, and Ray ships it by value with the globals its methods use. A module pickles by
# reference; a ContextVar does not pickle at all.
from . import _context
from ._backend import Backend, CallHandle, RankArgs
from ._binding import bind_worker_methods
from ._call import Call
from ._colocate import check_class_dict, check_prefix_set, shallow_copy
from ._errors import ColocationError, ConfigTypeError, UnknownRoleError
from ._resource import ClassWithInitArgs
from ._runtime import GroupLike
from ._worker import Worker

__all__ = [
    "FUSED_METHOD_SEPARATOR",
    "FusedBackend",
    "check_fused_worker_used",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "is_fused_group",
    "spawn_fused",
]

WG = TypeVar("WG", bound=GroupLike)

#: ``_fuw_execute("{role}_fwmn_{method}", ...)`` runs ``method`` of role ``role`` (verl's form).
FUSED_METHOD_SEPARATOR = "_fwmn_"


class FusedBackend:
    """The backend of one role's group of a fused worker class: every call of ``method``
    runs the fused worker's ``execute_fn_name`` (``_fuw_execute``) with
    ``"{role}_fwmn_{method}"`` before the rank's arguments, on the fused group's backend
    (verl's routing, kept out of the call path)."""

    def __init__(self, inner: Backend, role: str, execute_fn_name: str) -> None:
        self.inner = inner
        self.role = role
        self.execute_fn_name = execute_fn_name

    def start(self, call: Call, method_name: str, rank_args: Sequence[RankArgs]) -> CallHandle:
        target = f"{self.role}{FUSED_METHOD_SEPARATOR}{method_name}"
        routed = [((target, *args), kwargs) for args, kwargs in rank_args]
        return self.inner.start(call, self.execute_fn_name, routed)

    def wait(self, handle: CallHandle) -> list[Any]:
        return self.inner.wait(handle)

    def pending(self, handle: CallHandle) -> list[Any]:
        return self.inner.pending(handle)

    def is_done(self, rank_handle: Any) -> bool:
        return self.inner.is_done(rank_handle)

    def cancel(self, rank_handle: Any) -> bool:
        return self.inner.cancel(rank_handle)

    def is_alive(self, rank: int) -> bool:
        return self.inner.is_alive(rank)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # optional parts of the contract (wait_any, replace) are the inner backend's
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def _fused_worker_cls(where: str, class_dict: Mapping[str, ClassWithInitArgs[Any]]) -> type[Worker]:
    roles = check_class_dict(where, class_dict)
    for role in roles:
        if hasattr(Worker, role):
            raise ColocationError(
                f"{where}: role {role!r} is the name of a Worker attribute; rename the role"
            )
    raw_cls_dict = {role: user_cls for role, (user_cls, _) in roles.items()}

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        Worker.__init__(self, *args, **kwargs)
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
        role, sep, name = (
            method_name.partition(FUSED_METHOD_SEPARATOR)
            if isinstance(method_name, str)
            else ("", "", "")
        )
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


def create_colocated_worker_raw_cls(
    class_dict: Mapping[str, ClassWithInitArgs[Any]],
) -> type[Worker]:
    """verl's fused worker class (``FusedWorker``) running every role of ``class_dict``
    (role name → class with args) in one worker; subclass it to add methods of your own.

    The class, named ``FusedWorker_<role>_<role>...``, builds each role's instance with its
    own arguments; the instance is ``self.<role>`` and ``self.fused_worker_dict[role]``, and
    every role instance's ``fused_worker_dict`` is that same mapping, so roles (and the
    methods of a subclass) reach each other. Nothing is exposed as ``{role}_{method}``:
    calls reach a role through ``_fuw_execute("{role}_fwmn_{method}", *args, **kwargs)``,
    which the groups made by :meth:`~sc_core.WorkerGroup.spawn` (of a fused group),
    :meth:`~sc_core.WorkerGroup.spawn_fused` and :meth:`~sc_core.WorkerGroup.fuse` send. The
    class has ``is_fused_worker = True`` and ``raw_cls_dict`` (role name → user class).

    A subclass's own ``@register``-ed methods are bound on the fused group itself and run
    directly. A group of this class (or a subclass) spawns fused role groups whether or not
    its ``ClassWithInitArgs`` sets ``fused_worker_used``. A role named like a ``Worker``
    attribute, or not an identifier, is a :class:`~sc_core.ColocationError`; a role that is
    not a ``Worker`` class is a :class:`~sc_core.ConfigTypeError`.
    """
    return _fused_worker_cls("create_colocated_worker_raw_cls", class_dict)


def create_colocated_worker_cls_fused(
    class_dict: Mapping[str, ClassWithInitArgs[Any]],
) -> ClassWithInitArgs[Worker]:
    """The class of :func:`create_colocated_worker_raw_cls` in a
    :class:`~sc_core.ClassWithInitArgs` (no arguments) whose ``fused_worker_used`` is
    ``True``, ready for a worker group's constructor (verl's replacement of
    :func:`create_colocated_worker_cls`).

    On a group of it, :meth:`~sc_core.WorkerGroup.spawn` returns one group per role (each
    binding that role's registered methods under their plain names and calling them through
    ``_fuw_execute``), and :meth:`~sc_core.WorkerGroup.fuse` makes those groups attributes
    of the group (``wg.actor.update(...)``). Errors as in
    :func:`create_colocated_worker_raw_cls`.
    """
    cia: ClassWithInitArgs[Worker] = ClassWithInitArgs(
        _fused_worker_cls("create_colocated_worker_cls_fused", class_dict)
    )
    cia.fused_worker_used = True
    return cia


def is_fused_group(group: GroupLike) -> bool:
    """Whether ``group`` runs a fused worker class: its ``fused_worker_used`` is set (verl's
    flag, copied from its ``ClassWithInitArgs``), or its worker class is a fused class."""
    cls = group._user_defined_cls
    return group.fused_worker_used is True or getattr(cls, "is_fused_worker", False) is True


def check_fused_worker_used(where: str, cia: ClassWithInitArgs[Any]) -> bool:
    """``cia.fused_worker_used``, refused unless it is a bool (a backend's group copies it)."""
    flag = getattr(cia, "fused_worker_used", False)
    if not isinstance(flag, bool):
        raise ConfigTypeError(
            f"{where}: fused_worker_used of {cia!r} must be a bool, "
            f"got {type(flag).__qualname__} {flag!r}"
        )
    return flag


def spawn_fused(group: WG, prefix_set: Iterable[str]) -> dict[str, WG]:
    """One group per role of a fused worker class (:func:`create_colocated_worker_raw_cls`,
    or a subclass of it): the group of role ``r`` binds ``r``'s own registered methods under
    their plain names and sends every call through the fused worker's ``_fuw_execute``."""
    where = f"{type(group).__name__}.spawn_fused"
    cls = group._user_defined_cls
    raw: dict[str, type] | None = getattr(cls, "raw_cls_dict", None)
    if not getattr(cls, "is_fused_worker", False) or not isinstance(raw, dict):
        flag = (
            " (the group's fused_worker_used is True, but the class is not fused)"
            if group.fused_worker_used is True
            else ""
        )
        raise ConfigTypeError(
            f"{where}: the worker class {getattr(cls, '__qualname__', None)} is not a fused "
            f"worker{flag}; build it with create_colocated_worker_cls_fused or "
            "create_colocated_worker_raw_cls"
        )
    check_prefix_set(where, prefix_set)
    result: dict[str, WG] = {}
    for prefix in prefix_set:
        if prefix not in raw:
            raise UnknownRoleError(
                f"{where}: unknown role {prefix!r}; the fused worker class has roles {sorted(raw)}"
            )
        new = shallow_copy(group)
        new._sc_methods.unbind_all()
        new._fused_role = prefix
        bind_worker_methods(new, raw[prefix])
        result[prefix] = new
    return result
