"""A run's registry: a tiny detached actor (``sc-run-registry`` in the run's namespace) that
holds the driver lease and the records of the run's pools, groups and other actors (an
engine-server fleet: :meth:`~sc_ray.RayRun.record_actors`).

The lease is fenced by an epoch: :meth:`RunRegistry.take_lease` is a compare-and-set on it,
and every later write names the epoch it holds, refused (``False``) once another driver
took the lease. A background thread tears the run down (its actors, its placement groups,
then the registry itself) when no heartbeat arrived for ``abandon_after_s`` seconds, with
or without a lease holder.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from typing import Any

from . import _ray_api as rapi
from ._run_teardown import RECORD_KINDS, release_run_resources, stop_methods

__all__ = ["RunRegistry"]

logger = logging.getLogger("sc_ray.runs")


class RunRegistry:
    """The registry of one run (runs as a Ray actor; see the module docstring).

    ``holder`` is the creating driver (``{"pid", "host", "job_id"}``), which holds the
    lease at epoch 1.
    """

    def __init__(
        self,
        run_id: str,
        namespace: str,
        abandon_after_s: float,
        lease_s: float,
        heartbeat_s: float,
        holder: dict[str, Any],
    ) -> None:
        self._lock = threading.Lock()
        self._namespace = namespace
        self._abandon_after_s = float(abandon_after_s)
        self._state: dict[str, Any] = {
            "run_id": run_id,
            "epoch": 1,
            "holder": dict(holder),
            "lease_s": float(lease_s),
            "heartbeat_s": float(heartbeat_s),
            "abandon_after_s": float(abandon_after_s),
            **{kind: {} for kind in RECORD_KINDS},
        }
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="sc-run-watch", daemon=True)
        self._watcher.start()

    # --- reads --------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """A copy of the run's state, with ``beat_age``: seconds since the last heartbeat."""
        with self._lock:
            out = copy.deepcopy(self._state)
            out["beat_age"] = time.monotonic() - self._beat
        return out

    # --- the lease ----------------------------------------------------------------------

    def take_lease(self, expected_epoch: int, holder: dict[str, Any]) -> int | None:
        """Give the lease to ``holder`` if the epoch is still ``expected_epoch``; returns the
        new epoch, or ``None`` if another driver took the lease meanwhile."""
        with self._lock:
            if self._state["epoch"] != expected_epoch:
                return None
            self._state["epoch"] = expected_epoch + 1
            self._state["holder"] = dict(holder)
            self._beat = time.monotonic()
            logger.warning(
                "run %s: driver %s takes the lease at epoch %d",
                self._state["run_id"],
                holder,
                expected_epoch + 1,
            )
            return expected_epoch + 1

    def heartbeat(self, epoch: int) -> bool:
        """The lease holder of ``epoch`` is alive; ``False`` if it lost the lease."""
        with self._lock:
            if self._state["epoch"] != epoch or self._state["holder"] is None:
                return False
            self._beat = time.monotonic()
            return True

    def release(self, epoch: int) -> bool:
        """The holder of ``epoch`` leaves the run running; the abandonment clock starts."""
        with self._lock:
            if self._state["epoch"] != epoch:
                return False
            self._state["holder"] = None
            self._beat = time.monotonic()
            return True

    # --- records ------------------------------------------------------------------------

    def record(self, epoch: int, kind: str, name: str, value: dict[str, Any]) -> bool:
        """Record pool, group or actor set ``name`` (``kind``: ``"pools"``, ``"groups"`` or
        ``"actors"``) for the holder of ``epoch``; ``False`` if it lost the lease."""
        with self._lock:
            if self._state["epoch"] != epoch or kind not in RECORD_KINDS:
                return False
            self._state[kind][name] = copy.deepcopy(value)
            self._beat = time.monotonic()
            return True

    # --- abandonment --------------------------------------------------------------------

    def _watch(self) -> None:
        period = min(1.0, self._abandon_after_s / 4)
        while not self._stop.wait(period):
            with self._lock:
                age = time.monotonic() - self._beat
                holder = self._state["holder"]
                stops = stop_methods(self._state)
            if age < self._abandon_after_s:
                continue
            logger.warning(
                "run %s: no heartbeat for %.1f s (abandon_after_s=%g, last holder %s); "
                "tearing the run down",
                self._state["run_id"],
                age,
                self._abandon_after_s,
                holder,
            )
            try:
                release_run_resources(self._namespace, keep_registry=True, stops=stops)
            finally:
                rapi.kill(rapi.current_actor())
            return
