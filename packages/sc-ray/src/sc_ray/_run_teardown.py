"""Tearing a run down: every named actor of its namespace, every placement group named with
its prefix. Used by :meth:`RayRun.teardown`, by :func:`teardown_run` (an operator's command,
no lease needed) and by the registry actor when the run is abandoned."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from . import _ray_api as rapi
from ._errors import UnknownRunError
from ._run_names import REGISTRY_NAME, pg_prefix, run_namespace

__all__ = ["RunInfo", "release_run_resources", "teardown_run"]

logger = logging.getLogger("sc_ray.runs")


@dataclass(frozen=True)
class RunInfo:
    """What a teardown released: the run, its actors' names and its placement groups' names."""

    run_id: str
    actors: tuple[str, ...]
    placement_groups: tuple[str, ...]


def release_run_resources(namespace: str, *, keep_registry: bool) -> tuple[list[str], list[str]]:
    """Kill every live named actor of ``namespace`` (the registry last, unless
    ``keep_registry``) and remove every placement group named with the run's prefix;
    returns the actors' and the placement groups' names."""
    names = rapi.named_actors(namespace)
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


def teardown_run(run_id: str) -> RunInfo:
    """Tear run ``run_id`` down without holding its lease (an operator's command): kill its
    actors (workers, spares, replacements, the registry) and remove its placement groups,
    found through the cluster's control store, so it works with the registry gone too.
    Needs ``ray.init`` (any namespace). :class:`UnknownRunError` if nothing of the run
    exists."""
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
    actors, groups = release_run_resources(namespace, keep_registry=False)
    return RunInfo(run_id, tuple(actors), tuple(groups))
