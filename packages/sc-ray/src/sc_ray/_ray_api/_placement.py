"""Placement groups and scheduling strategies."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, cast

from ._base import (
    NodeAffinitySchedulingStrategy,
    PlacementGroup,
    PlacementGroupSchedulingStrategy,
    SchedulingStrategy,
    _pg_mod,
    ray,
)

# --- placement groups --------------------------------------------------------------------


def create_placement_group(
    bundles: Sequence[Mapping[str, float]],
    strategy: str,
    name: str,
    lifetime: str | None,
) -> PlacementGroup:
    """Ask Ray for a placement group; returns at once (see :func:`wait_placement_group`)."""
    pg = _pg_mod.placement_group(
        bundles=[dict(b) for b in bundles], strategy=strategy, name=name, lifetime=lifetime
    )
    return cast("PlacementGroup", pg)


def wait_placement_group(pg: PlacementGroup, timeout_s: float | None) -> bool:
    """Wait until every bundle of ``pg`` is reserved; ``False`` if ``timeout_s`` ran out."""
    ready, _ = ray.wait([cast(Any, pg).ready()], num_returns=1, timeout=timeout_s)
    return bool(ready)


def remove_placement_group(pg: PlacementGroup) -> None:
    """Release a placement group (and kill what runs in it); a removed one is ignored."""
    with contextlib.suppress(Exception):
        _pg_mod.remove_placement_group(pg)


def get_placement_group(name: str) -> PlacementGroup | None:
    """The live placement group called ``name`` in this namespace, or ``None``."""
    try:
        pg = _pg_mod.get_placement_group(name)
    except ValueError:
        return None
    return cast("PlacementGroup", pg)


def placement_group_id(pg: PlacementGroup) -> str:
    """The hex id of a placement group."""
    return str(cast(Any, pg).id.hex())


def _table(pg: PlacementGroup) -> dict[str, Any]:
    return cast("dict[str, Any]", _pg_mod.placement_group_table(pg))


def placement_group_name(pg: PlacementGroup) -> str:
    """The name a placement group was created with."""
    return str(_table(pg).get("name", ""))


def placement_group_state(pg: PlacementGroup) -> str:
    """``PENDING``, ``CREATED``, ``REMOVED``, ``RESCHEDULING`` (Ray's spelling)."""
    return str(_table(pg).get("state", "UNKNOWN"))


def placement_group_states() -> dict[str, tuple[str, str]]:
    """Every placement group of the cluster: ``{id: (name, state)}``."""
    table = cast("dict[str, dict[str, Any]]", _pg_mod.placement_group_table())
    return {str(k): (str(v.get("name", "")), str(v.get("state", ""))) for k, v in table.items()}


def placement_group_bundles(pg: PlacementGroup) -> list[dict[str, float]]:
    """The resources of each bundle of ``pg``."""
    specs = cast(Any, pg).bundle_specs
    return [{str(k): float(v) for k, v in dict(b).items()} for b in specs]


def placement_group_bundle_nodes(pg: PlacementGroup) -> list[str]:
    """The node id each bundle of a ready placement group sits on, in bundle order."""
    raw = cast("dict[Any, Any]", _table(pg).get("bundles_to_node_id", {}))
    return [str(raw[k]) for k in sorted(raw)]


def placement_group_bundle_node_map(pg: PlacementGroup) -> dict[int, str]:
    """``{bundle index: node id}`` for the bundles of ``pg`` Ray has placed now (a group
    being rescheduled after a node loss may lack some, or still name the lost node)."""
    raw = cast("dict[Any, Any]", _table(pg).get("bundles_to_node_id", {}))
    return {int(k): str(v) for k, v in raw.items() if v}


def placement_strategy(
    pg: PlacementGroup, bundle_index: int, capture_child_tasks: bool = False
) -> SchedulingStrategy:
    """Schedule onto bundle ``bundle_index`` of ``pg``."""
    return cast(
        "SchedulingStrategy",
        PlacementGroupSchedulingStrategy(
            placement_group=pg,
            placement_group_bundle_index=bundle_index,
            placement_group_capture_child_tasks=capture_child_tasks,
        ),
    )


def node_affinity(node_id: str, soft: bool = False) -> SchedulingStrategy:
    """Schedule onto the node ``node_id``."""
    return cast("SchedulingStrategy", NodeAffinitySchedulingStrategy(node_id=node_id, soft=soft))
