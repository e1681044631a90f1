"""The trainer's engine servers: a fleet on Ray, a router over it, and the actor's weights
pushed to them, each push under a weight version of its own.

The servers' weight versions only grow (the rollout-engine contract), while the actor's
version can go back: a recovery in place restores an older checkpoint. So a push carries the
actor's version while versions grow, and the next number after the last push when the actor
went back (a *push version*); :meth:`EngineServers.actor_version` maps every push version the
fleet made back to the actor version whose weights it holds, and the rollout sources report
and bound staleness in actor versions through it (:meth:`EngineServers.in_actor_versions`).

In a detached run (``run``: sc-ray's ``RayRun``) the fleet is the run's: its CPU (or GPU)
pool is a pool of the run, its server actors are detached and named ``<engine>-<i>`` in the
run's namespace, and the run records them (``RayRun.record_actors``, with ``stop`` as the
method a teardown calls first), so ``sc-demo --teardown ID`` releases them with the workers.
A driver that re-attaches adopts the live actors (their URLs read from them; a server
process that died meanwhile is started again by its actor) under a new router, and
:meth:`EngineServers.resume` restores the push bookkeeping the run state holds
(:meth:`EngineServers.snapshot`), waits until the servers are done with the dead driver's
requests, and gives every server the weights of the last push before the replayed step
starts. Were the servers already past that push (the dead driver pushed during the step),
those weights go out under the next push version: the replayed step then generates with
the weights it generated with the first time, and its own push exports to the same folder
as before (the export is a journaled worker call: a replay is answered from the workers'
journals), under a version above the servers'.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from sc_core import WorkerGroup
from sc_protocol import DataProto
from sc_rollout import RolloutClient, Router, ScRolloutError, VLLMEngineConfig, WeightUpdate
from sc_rollout.engines import find_vllm_env, vllm_argv, vllm_env_vars
from sc_workers import ActorRolloutRefWorker
from sc_workers.rollout import TorchRolloutEngineConfig, torch_engine_argv

from .._errors import RolloutFleetError
from ._fleet import ArgvFactory, RolloutServerFleet
from ._fleet_ray import gpu_pool
from ._source import ServersSnapshot

if TYPE_CHECKING:  # a type only: importing sc_ray imports Ray
    from sc_ray import RayRun

__all__ = ["EngineServers", "ServerEngine"]

logger = logging.getLogger(__name__)

#: the engines a server rollout runs
ServerEngine = Literal["builtin", "vllm"]

#: the weight folders kept on disk: the newest pushes'
_KEEP_VERSIONS = 2
#: push versions whose actor version the bookkeeping keeps (the newest; older ones are no
#: longer reported by any batch the staleness bound reads)
_KEEP_MAP = 64
#: how often :meth:`EngineServers.drain` asks a server whether it is done (seconds)
_DRAIN_POLL_S = 0.1


def _argv_factory(
    engine: ServerEngine, model: str, seed: int, device: str, exact_window: int
) -> tuple[ArgvFactory, dict[str, str]]:
    """How to start one server of ``engine``, and what its environment adds."""
    if engine == "vllm":
        config = VLLMEngineConfig(model=model, seed=seed)
        python = str(find_vllm_env().python)
        env = vllm_env_vars(config, {})
        return (lambda host, port: vllm_argv(config, python, host, port)), env
    # the built-in engine on the GPU Ray gives the server's actor (its only visible one)
    torch_device = "cuda" if device == "cuda" else "cpu"
    torch_config = TorchRolloutEngineConfig(
        model=model, seed=seed, device=torch_device, exact_window=exact_window
    )
    return (lambda host, port: torch_engine_argv(torch_config, host, port)), {}


def _fleet_spec(
    engine: str, model: str, seed: int, device: str, num_servers: int, exact_window: int
) -> dict[str, Any]:
    """What a detached run records of its fleet, and a re-attaching driver must repeat."""
    return {
        "engine": engine,
        "model": model,
        "seed": seed,
        "device": device,
        "servers": num_servers,
        **({"exact_window": exact_window} if exact_window else {}),
    }


class EngineServers:
    """``num_servers`` servers of ``engine`` serving ``model``, a router over them, and the
    push of the actor group's weights to them; :meth:`close` stops the servers.

    ``run``: a detached run's (sc-ray's ``RayRun``): the fleet is the run's, created and
    recorded, or adopted when the run has it already (see the module's documentation);
    a re-attaching driver whose fleet differs (engine, model, seed, device, number of
    servers, exact window) is refused with a :class:`RolloutFleetError` naming what differs."""

    def __init__(
        self,
        engine: ServerEngine,
        model: str,
        num_servers: int,
        run_dir: Path,
        actor: WorkerGroup[ActorRolloutRefWorker],
        *,
        seed: int = 0,
        device: str = "cpu",
        start_timeout_s: float = 900.0,
        run: RayRun | None = None,
        exact_window: int = 0,
    ) -> None:
        factory, env = _argv_factory(engine, model, seed, device, exact_window)
        self.engine = engine
        self.actor = actor
        self.weights_dir = Path(run_dir) / "weights"
        #: the last push version (None: nothing pushed yet)
        self.last_push: int | None = None
        self._actor_of: dict[int, int] = {}
        #: the folders of the newest pushes, oldest first (the last one the servers hold)
        self._paths: list[str] = []
        self._start_timeout = float(start_timeout_s)
        started = time.perf_counter()
        if run is None:
            # on a GPU run each server gets a GPU of its own (a pool beside the training pools)
            pool = gpu_pool(num_servers, f"{engine}_fleet_") if device == "cuda" else None
            self.fleet = RolloutServerFleet(
                factory,
                num_servers,
                pool=pool,
                env=env,
                start_timeout_s=start_timeout_s,
                name_prefix=engine,
            )
        else:
            spec = _fleet_spec(engine, model, seed, device, num_servers, exact_window)
            self.fleet = _run_fleet(run, spec, factory, env, start_timeout_s)
        logger.info(
            "%d %s rollout server(s) up in %.0f s%s",
            num_servers,
            engine,
            time.perf_counter() - started,
            f" (adopted {self.fleet.adopted})" if self.fleet.adopted else "",
        )

    @property
    def router(self) -> Router:
        """The router over the servers."""
        return self.fleet.router

    @property
    def names(self) -> list[str]:
        """The servers' names (``<engine>-<i>``; in a detached run, their actors' too)."""
        return self.fleet.names

    def push(self, actor_version: int) -> int:
        """Export the actor's weights (those of ``actor_version``) and load them in every
        server; returns the push version they are served under (see the module's
        documentation).

        The folder is ``weights/v<n>``, ``n`` the actor's version while versions grow, else
        the next number after the last push; the push version is that number too, unless
        the router already holds it or a higher one (a re-attached driver that had to give
        the servers older weights again: :meth:`resume`), then the next one above."""
        last = self.last_push
        planned = actor_version if last is None or actor_version > last else last + 1
        current = self.router.weight_version
        version = planned if current is None or planned > current else current + 1
        folder = self.weights_dir / f"v{planned}"
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        self.actor.export_hf_model(str(folder))
        self.router.push_weights(WeightUpdate(version=version, path=str(folder)))
        self._pushed(version, actor_version, str(folder))
        if version != actor_version:
            logger.info("actor version %d pushed as weight version %d", actor_version, version)
        self._prune()
        return version

    def _pushed(self, version: int, actor_version: int, path: str) -> None:
        self._actor_of[version] = actor_version
        for old in sorted(self._actor_of)[:-_KEEP_MAP]:
            del self._actor_of[old]
        self.last_push = version
        self._paths = [*(p for p in self._paths if p != path), path][-_KEEP_VERSIONS:]

    # --- a detached run's re-attach ------------------------------------------------------------

    def snapshot(self) -> ServersSnapshot:
        """What a driver that re-attaches needs (see :class:`ServersSnapshot`): the fleet's
        names and the push bookkeeping, as of now."""
        return ServersSnapshot(
            names=tuple(self.fleet.names),
            last_push=self.last_push,
            weights_path=self._paths[-1] if self._paths else None,
            recent_paths=tuple(self._paths),
            actor_version_of={v: a for v, a in self._actor_of.items() if v != a},
        )

    def resume(self, snapshot: ServersSnapshot) -> None:
        """Continue from a previous driver's :meth:`snapshot` (written as the step it dies
        in began): restore the push bookkeeping, wait until the servers are done with that
        driver's requests (:meth:`drain`), and give every server the weights of the last
        push, under its version, or under the next version above the servers' when the
        dead driver had pushed newer ones (see the module's documentation). A server
        restarted by its actor meanwhile is re-synced by the same push."""
        if list(snapshot.names) != self.fleet.names:
            raise RolloutFleetError(
                f"EngineServers.resume: the run's servers are {list(snapshot.names)}, this "
                f"driver's fleet is {self.fleet.names}"
            )
        self.last_push = snapshot.last_push
        self._actor_of = dict(snapshot.actor_version_of)
        self._paths = list(snapshot.recent_paths)
        held = self.drain()
        last, path = snapshot.last_push, snapshot.weights_path
        if last is None or path is None:  # nothing pushed yet: the prologue pushes
            return
        version = last
        ahead = max(held.values(), default=last)
        if ahead > last:
            version = ahead + 1
            self._actor_of[version] = self.actor_version(last)
            logger.warning(
                "the servers hold weight version %d, past the run state's last push %d: "
                "its weights go out again as version %d for the replayed step",
                ahead,
                last,
                version,
            )
        self.router.push_weights(WeightUpdate(version=version, path=path))

    def drain(self, timeout_s: float | None = None) -> dict[str, int]:
        """Wait until no server has a request in flight (a dead driver's: the replayed step
        sends the same request ids, which a server refuses while the first ones run), at
        most ``timeout_s`` seconds (default: the start timeout); returns the weight version
        each server holds. :class:`RolloutFleetError` names a server still busy."""
        limit = self._start_timeout if timeout_s is None else float(timeout_s)
        deadline = time.monotonic() + limit
        held: dict[str, int] = {}
        for status in self.router.servers():
            client = RolloutClient(status.url)
            while True:
                try:
                    health = client.health()
                except ScRolloutError as exc:  # out: the router restarts and re-syncs it
                    logger.warning("drain: server %s did not answer: %s", status.name, exc)
                    break
                if health.in_flight == 0:
                    held[status.name] = health.weight_version
                    break
                if time.monotonic() > deadline:
                    raise RolloutFleetError(
                        f"EngineServers.drain: server {status.name} still has "
                        f"{health.in_flight} request(s) in flight after {limit:g} s"
                    )
                time.sleep(_DRAIN_POLL_S)
        return held

    def server_pids(self) -> dict[str, int | None]:
        """Each server's process id on its node (``None``: its process does not run)."""
        return {name: self.fleet.server_pid(name) for name in self.fleet.names}

    def actor_version(self, weight_version: int) -> int:
        """The actor version whose weights the servers' ``weight_version`` holds (a version
        this fleet never pushed, the servers' initial one, is the actor's own)."""
        return self._actor_of.get(int(weight_version), int(weight_version))

    def in_actor_versions(self, batch: DataProto) -> DataProto:
        """``batch`` (a rollout of these servers) with its weight versions as actor versions:
        the ``weight_version_min`` / ``weight_version_max`` columns (-1, no version, kept)
        and ``meta_info["weight_version"]``."""
        for column in ("weight_version_min", "weight_version_max"):
            values = batch.non_tensor_batch.get(column)
            if values is not None:
                mapped = [v if v < 0 else self.actor_version(v) for v in values.tolist()]
                batch.non_tensor_batch[column] = np.asarray(mapped, dtype=np.int64)
        if "weight_version" in batch.meta_info:
            batch.meta_info["weight_version"] = self.actor_version(
                batch.meta_info["weight_version"]
            )
        return batch

    def _prune(self) -> None:
        """Remove the weight folders other than the newest pushes' (:data:`_KEEP_VERSIONS`)."""
        keep = {Path(p).name for p in self._paths}
        for old in self.weights_dir.glob("v*"):
            if old.name[1:].isdigit() and old.name not in keep:
                shutil.rmtree(old, ignore_errors=True)

    def close(self, *, detach: bool = False) -> None:
        """Stop the servers and the pool they run on; ``detach`` (a detached run's driver
        that stops): close the router only, the servers stay for the next driver."""
        if detach:
            self.fleet.detach()
        else:
            self.fleet.close()


def _run_fleet(
    run: RayRun,
    spec: dict[str, Any],
    factory: ArgvFactory,
    env: dict[str, str],
    start_timeout_s: float,
) -> RolloutServerFleet:
    """A detached run's fleet (see the module's documentation): recorded before its actors
    exist (so that a driver dying meanwhile leaves nothing unrecorded), or adopted."""
    engine, count = str(spec["engine"]), int(spec["servers"])
    name = f"{engine}_fleet"
    recorded = run.actors(name)
    if recorded is not None:
        theirs = dict(recorded.get("spec") or {})
        diffs = [
            f"{key}: the run has {theirs.get(key)!r}, this driver asks {value!r}"
            for key, value in spec.items()
            if theirs.get(key) != value
        ]
        if diffs:
            raise RolloutFleetError(
                f"EngineServers: run {run.run_id!r} fleet {name!r} differs: " + "; ".join(diffs)
            )
    pool = run.resource_pool(
        name,
        [count],
        use_gpu=spec["device"] == "cuda",
        max_colocate_count=1,
        num_cpus_per_process=1.0,
    )
    names: Sequence[str] = RolloutServerFleet.actor_names(engine, count)
    if recorded is None:
        run.record_actors(name, names, stop_method="stop", spec=spec, pool=name)
    return RolloutServerFleet(
        factory,
        count,
        pool=pool,
        env=env,
        start_timeout_s=start_timeout_s,
        name_prefix=engine,
        detached=True,
        adopt=recorded is not None,
    )
