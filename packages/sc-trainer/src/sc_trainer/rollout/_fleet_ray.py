"""The Ray calls of the rollout-server fleet, in one place.

Ray's Python API is loosely typed (mypy sees it as ``Any``); every call the fleet makes goes
through the annotated functions and the :class:`RemoteActor` wrapper here, so nothing
untyped leaves this module. Ray and sc-ray are imported on first use, not with the package:
importing ``sc_trainer`` must not import Ray (``RAY_ENABLE_UV_RUN_RUNTIME_ENV`` is read
when Ray is first imported, see ``_launchers``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import RolloutFleetError

if TYPE_CHECKING:
    from sc_ray import RayResourcePool

__all__ = ["BundlePlace", "RemoteActor", "bundle_places", "cpu_pool", "gpu_pool"]

logger = logging.getLogger(__name__)


def _ray() -> Any:
    import ray

    return ray


def cpu_pool(count: int, name_prefix: str, num_cpus_per_process: float) -> RayResourcePool:
    """A CPU resource pool of ``count`` processes on one node."""
    from sc_ray import RayResourcePool

    return RayResourcePool(
        [count],
        use_gpu=False,
        name_prefix=name_prefix,
        max_colocate_count=1,
        num_cpus_per_process=num_cpus_per_process,
    )


def gpu_pool(count: int, name_prefix: str) -> RayResourcePool:
    """A pool of ``count`` processes on one node, each with one GPU (and one CPU): where the
    servers of a GPU engine run (vLLM's CUDA build sees the GPU Ray gives its actor)."""
    from sc_ray import RayResourcePool

    return RayResourcePool([count], use_gpu=True, name_prefix=name_prefix, max_colocate_count=1)


@dataclass(frozen=True)
class BundlePlace:
    """Where one server's actor runs: bundle ``bundle_index`` of a placement group
    (``placement_group`` is Ray's object), asking ``resources`` (Ray's actor options)."""

    placement_group: object
    bundle_index: int
    resources: Mapping[str, float]


def bundle_places(pool: RayResourcePool) -> list[BundlePlace]:
    """One place per process of ``pool`` (placing it if needed), in rank order."""
    resources = pool.actor_resources()
    return [
        BundlePlace(slot.placement_group, slot.bundle_index, dict(resources))
        for slot in pool.bundle_slots()
    ]


def _cause(exc: BaseException) -> str:
    """The message of what went wrong in an actor (a task error's cause, else ``exc``)."""
    cause = getattr(exc, "cause", None)
    inner = cause if isinstance(cause, BaseException) else exc
    return f"{type(inner).__name__}: {inner}"


class RemoteActor:
    """A Ray actor of class ``cls`` created on ``place`` with ``args``: its methods called by
    name, each with a deadline, Ray's failures turned into :class:`RolloutFleetError`.

    ``cls``'s module is shipped to the actor by value (cloudpickle), not imported there by
    name: the actor's process imports only what that module imports (for the server actor,
    sc-rollout, not the whole of sc_trainer with torch).

    ``detached``: the actor is named ``name`` in the driver's Ray namespace and outlives the
    driver (a detached run's); :meth:`find` gives a later driver the live actor of a name."""

    def __init__(
        self,
        cls: type,
        place: BundlePlace,
        name: str,
        args: tuple[object, ...],
        *,
        detached: bool = False,
    ) -> None:
        ray = _ray()
        ray.cloudpickle.register_pickle_by_value(sys.modules[cls.__module__])
        strategies = ray.util.scheduling_strategies
        strategy = strategies.PlacementGroupSchedulingStrategy(
            placement_group=place.placement_group,
            placement_group_bundle_index=place.bundle_index,
        )
        self.name = name
        named: dict[str, object] = {"name": name, "lifetime": "detached"} if detached else {}
        try:
            self._handle: Any = (
                ray.remote(cls)
                .options(
                    scheduling_strategy=strategy,
                    max_restarts=0,
                    max_concurrency=1,
                    **named,
                    **dict(place.resources),
                )
                .remote(*args)
            )
        except ValueError as exc:  # Ray's answer when the name is taken
            raise RolloutFleetError(f"{name}: the actor could not be created: {exc}") from exc

    @classmethod
    def find(cls, name: str) -> RemoteActor | None:
        """The live actor named ``name`` in the driver's Ray namespace (a detached run's
        server actor a previous driver created), or ``None``."""
        ray = _ray()
        try:
            handle = ray.get_actor(name)
        except ValueError:
            return None
        actor = cls.__new__(cls)
        actor.name = name
        actor._handle = handle
        return actor

    def call_async(self, method: str, *args: object) -> object:
        """Start ``method(*args)``; :meth:`wait` takes what it returns."""
        return getattr(self._handle, method).remote(*args)

    def wait(self, ref: object, method: str, timeout_s: float) -> object:
        """What the call ``ref`` of :meth:`call_async` returned; its error (or a deadline
        passed) as a :class:`RolloutFleetError` naming this actor and ``method``."""
        ray = _ray()
        try:
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RolloutFleetError(
                f"{self.name}.{method}() did not return within {timeout_s:g} s"
            ) from None
        except Exception as exc:
            raise RolloutFleetError(f"{self.name}.{method}() failed: {_cause(exc)}") from exc

    def call(self, method: str, *args: object, timeout_s: float) -> object:
        """``method(*args)`` on the actor, waited for (see :meth:`wait`)."""
        return self.wait(self.call_async(method, *args), method, timeout_s)

    def kill(self) -> None:
        """Kill the actor (not restarted); an actor already dead is ignored."""
        try:
            _ray().kill(self._handle, no_restart=True)
        except Exception as exc:  # already gone, or Ray shut down
            logger.debug("killing %s: %s", self.name, exc)
