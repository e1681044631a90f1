"""The trainer's engine servers: a fleet on Ray, a router over it, and the actor's weights
pushed to them, each push under a weight version of its own.

The servers' weight versions only grow (the rollout-engine contract), while the actor's
version can go back: a recovery in place restores an older checkpoint. So a push carries the
actor's version while versions grow, and the next number after the last push when the actor
went back (a *push version*); :meth:`EngineServers.actor_version` maps every push version the
fleet made back to the actor version whose weights it holds, and the rollout sources report
and bound staleness in actor versions through it (:meth:`EngineServers.in_actor_versions`).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Literal

import numpy as np
from sc_core import WorkerGroup
from sc_protocol import DataProto
from sc_rollout import (
    Router,
    VLLMEngineConfig,
    WeightUpdate,
    find_vllm_env,
    vllm_argv,
    vllm_env_vars,
)
from sc_workers import ActorRolloutRefWorker
from sc_workers.rollout import TorchEngineConfig, torch_engine_argv

from ._fleet import ArgvFactory, RolloutServerFleet
from ._fleet_ray import gpu_pool

__all__ = ["EngineServers", "ServerEngine"]

logger = logging.getLogger(__name__)

#: the engines a server rollout runs
ServerEngine = Literal["builtin", "vllm"]

_KEEP_VERSIONS = 2


def _argv_factory(
    engine: ServerEngine, model: str, seed: int, device: str
) -> tuple[ArgvFactory, dict[str, str]]:
    """How to start one server of ``engine``, and what its environment adds."""
    if engine == "vllm":
        config = VLLMEngineConfig(model=model, seed=seed)
        python = str(find_vllm_env().python)
        env = vllm_env_vars(config, {})
        return (lambda host, port: vllm_argv(config, python, host, port)), env
    # the built-in engine on the GPU Ray gives the server's actor (its only visible one)
    torch_device = "cuda" if device == "cuda" else "cpu"
    torch_config = TorchEngineConfig(model=model, seed=seed, device=torch_device)
    return (lambda host, port: torch_engine_argv(torch_config, host, port)), {}


class EngineServers:
    """``num_servers`` servers of ``engine`` serving ``model``, a router over them, and the
    push of the actor group's weights to them; :meth:`close` stops the servers."""

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
    ) -> None:
        factory, env = _argv_factory(engine, model, seed, device)
        # on a GPU run each server gets a GPU of its own (a pool beside the training pools)
        pool = gpu_pool(num_servers, f"{engine}_fleet_") if device == "cuda" else None
        self.engine = engine
        self.actor = actor
        self.weights_dir = Path(run_dir) / "weights"
        #: the last push version (None: nothing pushed yet)
        self.last_push: int | None = None
        self._actor_of: dict[int, int] = {}
        started = time.perf_counter()
        self.fleet = RolloutServerFleet(
            factory,
            num_servers,
            pool=pool,
            env=env,
            start_timeout_s=start_timeout_s,
            name_prefix=engine,
        )
        logger.info(
            "%d %s rollout server(s) up in %.0f s",
            num_servers,
            engine,
            time.perf_counter() - started,
        )

    @property
    def router(self) -> Router:
        """The router over the servers."""
        return self.fleet.router

    def push(self, actor_version: int) -> int:
        """Export the actor's weights (those of ``actor_version``) and load them in every
        server; returns the push version they are served under (see the module's
        documentation)."""
        last = self.last_push
        version = actor_version if last is None or actor_version > last else last + 1
        folder = self.weights_dir / f"v{version}"
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        self.actor.export_hf_model(str(folder))
        self.router.push_weights(WeightUpdate(version=version, path=str(folder)))
        self._actor_of[version] = actor_version
        self.last_push = version
        if version != actor_version:
            logger.info("actor version %d pushed as weight version %d", actor_version, version)
        self._prune(version)
        return version

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

    def _prune(self, newest: int) -> None:
        for old in self.weights_dir.glob("v*"):
            suffix = old.name[1:]
            if suffix.isdigit() and int(suffix) <= newest - _KEEP_VERSIONS:
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        """Stop the servers and the pool they run on."""
        self.fleet.close()
