"""Colocation on Ray: sc-core's colocated and fused worker classes, as Ray actor classes.

The mechanism (one worker process holding one instance per role) is sc-core's; sc-ray only
merges the roles' Ray options and wraps the class for :class:`RayWorkerGroup`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sc_core import ClassWithInitArgs, ColocationError
from sc_core import create_colocated_worker_cls_fused as _core_fused
from sc_core import create_colocated_worker_raw_cls as _core_raw

from ._class_with_init import RayClassWithInitArgs, merge_options

__all__ = ["create_colocated_worker_cls", "create_colocated_worker_cls_fused"]


def _merged(class_dict: Mapping[str, ClassWithInitArgs[Any]], where: str) -> RayClassWithInitArgs:
    if not isinstance(class_dict, Mapping) or not class_dict:
        raise ColocationError(f"{where}: class_dict must be a non-empty mapping of role to class")
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
    fused = where.endswith("_fused")
    out = RayClassWithInitArgs(_core_fused(class_dict) if fused else _core_raw(class_dict))
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
    return _merged(class_dict, "create_colocated_worker_cls")


def create_colocated_worker_cls_fused(
    class_dict: Mapping[str, ClassWithInitArgs[Any]],
) -> RayClassWithInitArgs:
    """verl's fused variant: calls reach a role through ``_fuw_execute``; use
    :meth:`~sc_core.WorkerGroup.spawn_fused` or :meth:`~sc_core.WorkerGroup.fuse`. Role
    methods may be ``async def`` (the actor then runs them on its event loop)."""
    return _merged(class_dict, "create_colocated_worker_cls_fused")
