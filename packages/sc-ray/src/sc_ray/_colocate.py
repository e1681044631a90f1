"""Colocation on Ray: sc-core's colocated and fused worker classes, as Ray actor classes.

The mechanism (one worker process holding one instance per role) is sc-core's; sc-ray only
merges the roles' Ray options and wraps the class for :class:`RayWorkerGroup`. As in verl,
:func:`create_colocated_worker_raw_cls` returns the fused class itself (to subclass),
:func:`create_colocated_worker_cls_fused` that class in a :class:`RayClassWithInitArgs`
with ``fused_worker_used = True``, and :func:`create_colocated_worker_cls` the older
``WorkerDict`` class (``{role}_{method}`` names) in a :class:`RayClassWithInitArgs`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import sc_core
from sc_core import ClassWithInitArgs, ColocationError, Worker

from . import _ray_api as rapi
from ._class_with_init import RayClassWithInitArgs, merge_options
from ._fingerprint import ROLE_INITS_ATTR

__all__ = [
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
]

logger = logging.getLogger("sc_ray")


def _merged_options(
    class_dict: Mapping[str, ClassWithInitArgs[Any]], where: str
) -> tuple[dict[str, Any], dict[str, float]]:
    """The roles' Ray options merged (``runtime_env`` and ``resources`` key by key) and their
    custom resources (the largest amount of each); two roles setting one option to different
    values is a :class:`~sc_core.ColocationError` (``class_dict`` was checked by sc-core)."""
    options: dict[str, Any] = {}
    resources: dict[str, float] = {}
    for role, cia in class_dict.items():
        if isinstance(cia, RayClassWithInitArgs):
            for key, value in cia._options.items():
                merged_keys = ("runtime_env", "resources")
                if key in options and key not in merged_keys and options[key] != value:
                    raise ColocationError(
                        f"{where}: role {role!r} sets Ray option {key}={value!r}, another role "
                        f"set {options[key]!r}; colocated roles run in one actor"
                    )
            options = merge_options(options, cia._options)
            for key, amount in cia._additional_resource.items():
                resources[key] = max(resources.get(key, 0.0), amount)
    return options, resources


def _record_roles(cls: object, class_dict: Mapping[str, ClassWithInitArgs[Any]]) -> None:
    """Record each role's class and arguments on the colocated class, for its workers'
    fingerprints (``_fingerprint.py``), which a driver re-attaching to a run compares."""
    setattr(
        cls,
        ROLE_INITS_ATTR,
        {
            role: (rapi.unwrap_remote_class(cia.cls), tuple(cia.args), dict(cia.kwargs))
            for role, cia in class_dict.items()
        },
    )


def _wrapped(
    cls: Callable[..., Worker], options: dict[str, Any], resources: dict[str, float]
) -> RayClassWithInitArgs:
    out: RayClassWithInitArgs = RayClassWithInitArgs(cls)
    out.update_options(options)
    if resources:
        out.set_additional_resource(resources)
    return out


def create_colocated_worker_cls(
    class_dict: Mapping[str, ClassWithInitArgs[Any]],
) -> RayClassWithInitArgs:
    """One actor class running every role of ``class_dict`` (role -> class with arguments);
    each role's registered methods are exposed as ``{role}_{method}``. Give it to a
    :class:`RayWorkerGroup` and call :meth:`~sc_core.WorkerGroup.spawn` for one group per
    role. The roles' Ray options are merged (``runtime_env`` key by key)."""
    worker_dict_cls = sc_core.create_colocated_worker_cls(class_dict).cls
    _record_roles(worker_dict_cls, class_dict)
    options, resources = _merged_options(class_dict, "create_colocated_worker_cls")
    return _wrapped(worker_dict_cls, options, resources)


def create_colocated_worker_raw_cls(
    class_dict: Mapping[str, ClassWithInitArgs[Any]],
) -> type[Worker]:
    """verl's fused worker class running every role of ``class_dict`` in one actor, to
    subclass with methods of your own (see :func:`sc_core.create_colocated_worker_raw_cls`).

    Wrap it (or your subclass, plain or ``ray.remote``-decorated) in a
    :class:`RayClassWithInitArgs`; a :class:`RayWorkerGroup` of it spawns and fuses one group
    per role. The class carries no Ray options: the roles' options (logged as a warning when
    there are any) are set on the :class:`RayClassWithInitArgs` you build from it, or use
    :func:`create_colocated_worker_cls_fused`, which merges them.
    """
    cls = sc_core.create_colocated_worker_raw_cls(class_dict)
    _record_roles(cls, class_dict)
    for role, cia in class_dict.items():
        if isinstance(cia, RayClassWithInitArgs) and (cia._options or cia._additional_resource):
            logger.warning(
                "create_colocated_worker_raw_cls: role %r sets Ray options %s and resources "
                "%s, which the raw fused class does not carry; set them on the "
                "RayClassWithInitArgs built from it",
                role,
                sorted(cia._options),
                dict(cia._additional_resource),
            )
    return cls


def create_colocated_worker_cls_fused(
    class_dict: Mapping[str, ClassWithInitArgs[Any]],
) -> RayClassWithInitArgs:
    """:func:`create_colocated_worker_raw_cls`'s class in a :class:`RayClassWithInitArgs`
    with ``fused_worker_used = True`` and the roles' Ray options merged. A
    :class:`RayWorkerGroup` of it runs every role in one actor per rank; its
    :meth:`~sc_core.WorkerGroup.spawn` (or :meth:`~sc_core.WorkerGroup.spawn_fused`) gives one
    group per role and :meth:`~sc_core.WorkerGroup.fuse` makes them attributes
    (``wg.actor.update(...)``); calls reach a role through ``_fuw_execute``. Role methods may
    be ``async def`` (the actor then runs them on its event loop)."""
    fused_cls = sc_core.create_colocated_worker_cls_fused(class_dict).cls
    _record_roles(fused_cls, class_dict)
    options, resources = _merged_options(class_dict, "create_colocated_worker_cls_fused")
    out = _wrapped(fused_cls, options, resources)
    out.fused_worker_used = True
    return out
