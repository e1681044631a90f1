"""Actor classes, actors and calls on them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ._base import (
    ActorHandle,
    ObjectRef,
    PlacementGroup,
    RemoteClass,
    _pg_mod,
    _raylet,
    _state,
    ray,
)

# --- actors ------------------------------------------------------------------------------


def remote_class(cls: object, concurrency_groups: Mapping[str, int] | None = None) -> RemoteClass:
    """``ray.remote(cls)``, with ``concurrency_groups`` (name: threads) when given (a class
    already wrapped is returned as it is)."""
    if isinstance(cls, ray.actor.ActorClass):
        return cast("RemoteClass", cls)
    if concurrency_groups:
        return cast("RemoteClass", ray.remote(concurrency_groups=dict(concurrency_groups))(cls))
    return cast("RemoteClass", ray.remote(cls))


def create_actor(
    remote_cls: RemoteClass,
    options: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> ActorHandle:
    """``remote_cls.options(**options).remote(*args, **kwargs)``."""
    handle = cast(Any, remote_cls).options(**dict(options)).remote(*args, **dict(kwargs))
    return cast("ActorHandle", handle)


def call_actor(
    actor: ActorHandle,
    method: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    concurrency_group: str | None = None,
) -> ObjectRef:
    """``actor.<method>.remote(*args, **kwargs)``, in the actor's concurrency group
    ``concurrency_group`` when given."""
    bound = getattr(actor, method)
    if concurrency_group is not None:
        bound = bound.options(concurrency_group=concurrency_group)
    return cast("ObjectRef", bound.remote(*args, **dict(kwargs)))


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    """The named actor ``name``; raises ``ValueError`` if there is none."""
    return cast("ActorHandle", ray.get_actor(name, namespace=namespace))


def kill(actor: ActorHandle) -> None:
    """Kill an actor without restarting it; an actor already dead is ignored."""
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)


class _GoneActor:
    """Stands, in a group's rank list, for an actor found dead (a run's re-attach):
    reported ``DEAD``, killing it does nothing, and it takes no calls."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<dead actor {self.name!r}>"


def gone_actor(name: str) -> ActorHandle:
    """A stand-in for the dead actor ``name`` (see :class:`_GoneActor`)."""
    return cast("ActorHandle", _GoneActor(name))


def actor_id(actor: ActorHandle) -> str:
    """The hex id of an actor."""
    return str(cast(Any, actor)._actor_id.hex())


@dataclass(frozen=True)
class ActorState:
    """What the cluster's control store says about one actor."""

    actor_id: str
    name: str
    state: str
    class_name: str


def actor_states() -> dict[str, ActorState]:
    """Every actor this cluster has known, keyed by hex id (``ALIVE``, ``DEAD``, ...)."""
    out: dict[str, ActorState] = {}
    for key, raw in cast("dict[Any, dict[str, Any]]", _state.actors()).items():
        out[str(key)] = ActorState(
            actor_id=str(key),
            name=str(raw.get("Name", "")),
            state=str(raw.get("State", "")),
            class_name=str(raw.get("ActorClassName", "")),
        )
    return out


def is_actor_handle(obj: object) -> bool:
    """Whether ``obj`` is a Ray actor handle."""
    return isinstance(obj, ray.actor.ActorHandle)


def unwrap_remote_class(cls: object) -> type:
    """The Python class behind ``ray.remote(cls)`` (``cls`` itself if it is not wrapped)."""
    inner = getattr(cls, "__ray_actor_class__", None)
    if isinstance(inner, type):
        return inner
    if isinstance(cls, type):
        return cls
    raise TypeError(f"expected a class or a ray.remote class, got {type(cls).__qualname__}")


def remote_class_inner(obj: object) -> type | None:
    """The Python class behind ``ray.remote(cls)``, or ``None`` for anything else."""
    if not isinstance(obj, ray.actor.ActorClass):
        return None
    inner = getattr(obj, "__ray_actor_class__", None)
    return inner if isinstance(inner, type) else None


def is_remote_class(cls: object) -> bool:
    """Whether ``cls`` is a class wrapped by ``ray.remote``."""
    return isinstance(cls, ray.actor.ActorClass)


def _probe_placement_group(instance: object) -> str | None:
    found = ray.get_runtime_context().get_placement_group_id()
    return None if found is None else str(found)


def actor_placement_group(actor: ActorHandle, timeout_s: float | None) -> PlacementGroup | None:
    """The placement group a running actor was scheduled into, or ``None``."""
    ref = cast(Any, actor).__ray_call__.remote(_probe_placement_group)
    hex_id = ray.get(ref, timeout=timeout_s)
    if not hex_id:
        return None
    group_id = _raylet.PlacementGroupID(bytes.fromhex(hex_id))
    return cast("PlacementGroup", _pg_mod.PlacementGroup(group_id))


def _probe_actor(instance: object) -> tuple[str, str | None]:
    return str(ray.get_runtime_context().get_node_id()), os.environ.get("CUDA_VISIBLE_DEVICES")


def actor_node_and_devices(actor: ActorHandle, timeout_s: float | None) -> tuple[str, str | None]:
    """The node id and ``CUDA_VISIBLE_DEVICES`` of a running actor, whatever its class."""
    ref = cast(Any, actor).__ray_call__.remote(_probe_actor)
    node, devices = ray.get(ref, timeout=timeout_s)
    return str(node), (None if devices is None else str(devices))


def call_in_actor(
    actor: ActorHandle, fn: Callable[..., Any], args: Sequence[Any] = ()
) -> ObjectRef:
    """Run ``fn(actor_instance, *args)`` inside the actor (Ray's ``__ray_call__``)."""
    return cast("ObjectRef", cast(Any, actor).__ray_call__.remote(fn, *args))


def actor_state(actor: ActorHandle) -> str:
    """``ALIVE``, ``PENDING_CREATION``, ``RESTARTING``, ``DEAD`` (or ``UNKNOWN``)."""
    if isinstance(actor, _GoneActor):
        return "DEAD"
    try:
        raw = cast("dict[str, Any]", _state.actors(actor_id=actor_id(actor)))
    except Exception:
        return "UNKNOWN"
    return str(raw.get("State", "UNKNOWN")) if raw else "UNKNOWN"


def actor_node_id(actor: ActorHandle) -> str | None:
    """The node an actor was placed on, from the cluster's actor table (no call into the
    actor, which may be busy); ``None`` before it is placed, or when the table has no entry."""
    if isinstance(actor, _GoneActor):
        return None
    try:
        raw = cast("dict[str, Any]", _state.actors(actor_id=actor_id(actor)))
    except Exception:
        return None
    node = str((raw or {}).get("Address", {}).get("NodeID", "") or "")
    return None if not node or set(node) == {"0"} else node


def ready_ref(actor: ActorHandle) -> ObjectRef:
    """A reference that is ready once the actor's constructor has finished (or failed)."""
    return cast("ObjectRef", cast(Any, actor).__ray_ready__.remote())


def call_actor_multi(
    actor: ActorHandle,
    method: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    num_returns: int,
    concurrency_group: str | None = None,
) -> list[ObjectRef]:
    """``actor.<method>.options(num_returns=n).remote(...)``: one reference per return (in
    the actor's concurrency group ``concurrency_group`` when given)."""
    options: dict[str, Any] = {"num_returns": num_returns}
    if concurrency_group is not None:
        options["concurrency_group"] = concurrency_group
    refs = getattr(actor, method).options(**options).remote(*args, **dict(kwargs))
    if num_returns == 1:
        return [cast("ObjectRef", refs)]
    return [cast("ObjectRef", r) for r in refs]


def remote_class_options(cls: object) -> dict[str, Any]:
    """The options a ``ray.remote(...)`` decorator gave a class (empty for a plain class)."""
    raw = getattr(cls, "_default_options", None)
    return dict(raw) if isinstance(raw, Mapping) else {}
