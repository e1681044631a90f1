"""What runs (``_run.py``) ask of Ray: the namespace and job of this process, named actors of
a namespace, drivers' liveness, and placement groups found by name prefix.

Everything here reads the cluster's control store (GCS) directly, so it works on a cluster
started without the dashboard (``ray.util.state`` needs the dashboard's API server).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, cast

from ._base import ActorHandle, PlacementGroup, _pg_mod, _raylet, _state, ray


def current_namespace() -> str:
    """The Ray namespace this process is connected in."""
    return str(ray.get_runtime_context().namespace)


def current_job_id() -> str:
    """The hex id of this process's job (its driver's)."""
    return str(ray.get_runtime_context().get_job_id())


def current_actor() -> ActorHandle:
    """The handle of the actor this code runs in."""
    return cast("ActorHandle", ray.get_runtime_context().current_actor)


def named_actors(namespace: str) -> list[str]:
    """The names of the live named actors of ``namespace``."""
    found = cast("list[dict[str, Any]]", ray.util.list_named_actors(all_namespaces=True))
    return sorted(str(a["name"]) for a in found if a.get("namespace") == namespace)


def namespaces_with_actor(name: str) -> list[str]:
    """The namespaces holding a live actor called ``name``."""
    found = cast("list[dict[str, Any]]", ray.util.list_named_actors(all_namespaces=True))
    return sorted(str(a["namespace"]) for a in found if a.get("name") == name)


def kill_named(name: str, namespace: str) -> bool:
    """Kill the actor ``name`` of ``namespace`` (no restart); ``False`` if there is none."""
    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)
    return True


def job_is_dead(job_id: str) -> bool | None:
    """Whether the driver of job ``job_id`` (hex) has exited; ``None`` when the cluster does
    not know the job."""
    for job in cast("list[dict[str, Any]]", _state.state.job_table()):
        if str(job.get("JobID", "")) == job_id:
            return bool(job.get("IsDead", False))
    return None


def placement_groups_named(prefix: str) -> dict[str, str]:
    """The placement groups not removed whose name starts with ``prefix``: ``{id: name}``."""
    table = cast("dict[str, dict[str, Any]]", _pg_mod.placement_group_table())
    return {
        str(k): str(v.get("name", ""))
        for k, v in table.items()
        if str(v.get("name", "")).startswith(prefix) and v.get("state") != "REMOVED"
    }


def placement_group_by_id(hex_id: str) -> PlacementGroup:
    """A handle of the placement group with the hex id ``hex_id``."""
    group_id = _raylet.PlacementGroupID(bytes.fromhex(hex_id))
    return cast("PlacementGroup", _pg_mod.PlacementGroup(group_id))


def process_id() -> int:
    """This process's id (kept beside the job id a lease names)."""
    return os.getpid()
