"""Tearing a run down: every named actor of its namespace, every placement group named with
its prefix. Used by :meth:`RayRun.teardown`, by :func:`teardown_run` (an operator's command,
no lease needed) and by the registry actor when the run is abandoned.

Actors the run recorded with a stop method (:meth:`RayRun.record_actors`: an engine-server
fleet, whose actors own server processes) are asked to stop first, all at once and for at
most :data:`STOP_TIMEOUT_S` seconds, so that what they started ends cleanly; then every
actor is killed, stopped or not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _ray_api as rapi
from ._errors import UnknownRunError
from ._run_names import REGISTRY_NAME, pg_prefix, run_namespace

__all__ = [
    "RECORD_KINDS",
    "STOP_TIMEOUT_S",
    "RunInfo",
    "release_run_resources",
    "stop_methods",
    "teardown_run",
]

logger = logging.getLogger("sc_ray.runs")

#: What a run's registry records, by kind: its pools, its worker groups, its other actors.
RECORD_KINDS = ("pools", "groups", "actors")
#: How long a teardown waits for the recorded actors' stop methods (seconds).
STOP_TIMEOUT_S = 90.0
#: How long :func:`teardown_run` waits for the registry to say what to stop (seconds).
_REGISTRY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RunInfo:
    """What a teardown released: the run, its actors' names and its placement groups' names."""

    run_id: str
    actors: tuple[str, ...]
    placement_groups: tuple[str, ...]


def stop_methods(state: Mapping[str, Any]) -> dict[str, str]:
    """``{actor name: method}`` for every actor a run's ``state`` (the registry's) recorded
    with a stop method (:meth:`RayRun.record_actors`)."""
    out: dict[str, str] = {}
    for record in dict(state.get("actors") or {}).values():
        method = record.get("stop_method")
        if isinstance(method, str) and method:
            out.update({str(name): method for name in record.get("names", [])})
    return out


def _stop(namespace: str, stops: Mapping[str, str], alive: Sequence[str]) -> None:
    """Call each live actor's stop method (all at once) and wait for them, at most
    :data:`STOP_TIMEOUT_S` seconds in all; a failure is logged (the actor is killed next)."""
    pending: list[tuple[str, str, rapi.ObjectRef]] = []
    for name, method in stops.items():
        if name not in alive:
            continue
        try:
            actor = rapi.get_actor(name, namespace)
            pending.append((name, method, rapi.call_actor(actor, method, (), {})))
        except Exception as exc:  # gone meanwhile, or no such method: it is killed anyway
            logger.warning("teardown of %s: %s.%s() not called: %s", namespace, name, method, exc)
    deadline = rapi.monotonic() + STOP_TIMEOUT_S
    for name, method, ref in pending:
        try:
            rapi.get([ref], timeout_s=max(0.0, deadline - rapi.monotonic()))
        except Exception as exc:
            logger.warning("teardown of %s: %s.%s() failed: %s", namespace, name, method, exc)


def release_run_resources(
    namespace: str, *, keep_registry: bool, stops: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """Stop the actors of ``stops`` (``{name: method}``, see :func:`stop_methods`), then
    kill every live named actor of ``namespace`` (the registry last, unless
    ``keep_registry``) and remove every placement group named with the run's prefix;
    returns the actors' and the placement groups' names."""
    names = rapi.named_actors(namespace)
    if stops:
        _stop(namespace, stops, names)
    killed = [n for n in names if n != REGISTRY_NAME and rapi.kill_named(n, namespace)]
    groups = rapi.placement_groups_named(pg_prefix(namespace))
    for group_id in groups:
        rapi.remove_placement_group(rapi.placement_group_by_id(group_id))
    if not keep_registry and REGISTRY_NAME in names and rapi.kill_named(REGISTRY_NAME, namespace):
        killed.append(REGISTRY_NAME)
    logger.info(
        "released run namespace %s: actors %s, placement groups %s",
        namespace,
        killed,
        sorted(groups.values()),
    )
    return killed, sorted(groups.values())


def _recorded_stops(namespace: str) -> dict[str, str]:
    """What the run's registry says to stop first (nothing when the registry is gone or
    does not answer)."""
    try:
        registry = rapi.get_actor(REGISTRY_NAME, namespace)
        state = rapi.get(
            [rapi.call_actor(registry, "state", (), {})], timeout_s=_REGISTRY_TIMEOUT_S
        )[0]
    except Exception as exc:
        logger.info("teardown of %s: no registry state (%s); killing only", namespace, exc)
        return {}
    return stop_methods(state)


def teardown_run(run_id: str) -> RunInfo:
    """Tear run ``run_id`` down without holding its lease (an operator's command): stop the
    actors the run recorded with a stop method (its engine servers), kill its actors
    (workers, spares, replacements, server actors, the registry) and remove its placement
    groups, found through the cluster's control store, so it works with the registry gone
    too (then nothing is stopped first). Needs ``ray.init`` (any namespace).
    :class:`UnknownRunError` if nothing of the run exists."""
    namespace = run_namespace(run_id)
    if not rapi.is_initialized():
        raise UnknownRunError(
            f"teardown_run({run_id!r}): Ray is not initialised; call ray.init(address=...) first"
        )
    if not rapi.named_actors(namespace) and not rapi.placement_groups_named(pg_prefix(namespace)):
        raise UnknownRunError(
            f"teardown_run({run_id!r}): the cluster holds no actor of namespace {namespace!r} "
            f"and no placement group named {pg_prefix(namespace)}*"
        )
    stops = _recorded_stops(namespace)
    actors, groups = release_run_resources(namespace, keep_registry=False, stops=stops)
    return RunInfo(run_id, tuple(actors), tuple(groups))
