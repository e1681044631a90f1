"""Ray itself as ``Any``, and the opaque handle types every other part of ``_ray_api`` uses.

Ray's Python API is loosely typed (mypy sees it as ``Any``): it is imported here once, and
every value leaves ``_ray_api`` through an annotated function.
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import TYPE_CHECKING, Any

import ray as _ray
import ray._private.ray_constants as _ray_constants
import ray._private.state as _ray_state
import ray._raylet as _ray_raylet
import ray.cluster_utils as _ray_cluster_utils
import ray.exceptions as _ray_exceptions
import ray.util.scheduling_strategies as _ray_strategies

# Ray is only partly annotated; everything of it is used as ``Any`` here, and every value
# leaves this module through an annotated function.
ray: Any = _ray
_exc: Any = _ray_exceptions
#: Ray's private modules sc-ray reads: the control store's actor table, the placement group
#: id type, the constants (the ``uv run`` hook), and the multi-node test cluster.
_state: Any = _ray_state
_raylet: Any = _ray_raylet
_constants: Any = _ray_constants
_cluster_utils: Any = _ray_cluster_utils
# ``ray.util.placement_group`` is both a module and, on ``ray.util``, a function.
_pg_mod: Any = importlib.import_module("ray.util.placement_group")
NodeAffinitySchedulingStrategy: Any = _ray_strategies.NodeAffinitySchedulingStrategy
PlacementGroupSchedulingStrategy: Any = _ray_strategies.PlacementGroupSchedulingStrategy

logger = logging.getLogger("sc_ray")

logger = logging.getLogger("sc_ray")

if TYPE_CHECKING:

    class ObjectRef:
        """A reference to a value in Ray's object store (``ray.ObjectRef``)."""

    class ActorHandle:
        """A handle to a Ray actor (``ray.actor.ActorHandle``)."""

    class PlacementGroup:
        """A Ray placement group (``ray.util.placement_group.PlacementGroup``)."""

    class RemoteClass:
        """A class wrapped by ``ray.remote`` (``ray.actor.ActorClass``)."""

    class SchedulingStrategy:
        """A Ray scheduling strategy object."""

else:
    ObjectRef = ray.ObjectRef
    ActorHandle = ray.actor.ActorHandle
    PlacementGroup = _pg_mod.PlacementGroup
    RemoteClass = ray.actor.ActorClass
    SchedulingStrategy = object


def monotonic() -> float:
    """``time.monotonic()`` (kept here so tests can see one clock)."""
    return time.monotonic()
