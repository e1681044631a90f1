"""The trainer's rollout on engine servers (``--rollout builtin`` or ``--rollout vllm``).

Instead of a rollout worker group, the run starts ``rollout_servers`` engine servers, each
owned by a Ray actor on a CPU pool of its own (:class:`RolloutServerFleet`), and generates
through a router over them (:class:`RouterRollout`, the rollout worker's batch format). The
engine is sc-workers' built-in one (``python -m sc_workers.rollout``) or vLLM (``python -m
sc_rollout vllm``, run by the vLLM environment's interpreter; made by ``python -m sc_rollout
vllm-env create``, and a clear error naming that command when it is missing).

Weights: after each actor update the actor group writes its weights as a Hugging Face
folder under ``<output>/weights/v<version>`` (``export_hf_model``: rank 0 writes next to the
folder and renames it into place) and the router pushes that folder to every server, at the
actor's version (its number of updates). A server restarted by the router is re-synced to
the last version before it takes requests. The two newest folders are kept.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from sc_core import WorkerGroup
from sc_protocol import DataProto
from sc_rollout import VLLMEngineConfig, WeightUpdate, find_vllm_env, vllm_argv, vllm_env_vars
from sc_workers import ActorRolloutRefWorker, ModelConfig, RolloutConfig
from sc_workers.rollout import TorchEngineConfig, torch_engine_argv

from ._errors import TrainerStateError
from ._fleet_ray import gpu_pool
from ._partial_rollout import PartialRollout
from ._rollout_servers import ArgvFactory, RolloutServerFleet
from ._router_rollout import PendingBatch, RouterRollout, RouterSampling

__all__ = ["ServerEngine", "ServerRollout"]

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


class ServerRollout:
    """Rollout servers of ``engine`` serving ``model``, a router over them, and the weight
    push from the actor group; :meth:`close` stops the servers."""

    def __init__(
        self,
        engine: ServerEngine,
        model: str,
        num_servers: int,
        run_dir: Path,
        rollout: RolloutConfig,
        model_config: ModelConfig,
        *,
        seed: int = 0,
        device: str = "cpu",
        staleness: int = 0,
        start_timeout_s: float = 900.0,
    ) -> None:
        factory, env = _argv_factory(engine, model, seed, device)
        # on a GPU run each server gets a GPU of its own (a pool beside the training pools)
        pool = gpu_pool(num_servers, f"{engine}_fleet_") if device == "cuda" else None
        self.engine = engine
        self.weights_dir = Path(run_dir) / "weights"
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
        sampling = RouterSampling.from_configs(rollout, model_config)
        self.rollout = RouterRollout(self.fleet.router, sampling, session_key="uid")
        #: partial rollout (``staleness`` > 0), and the step whose batch generates meanwhile
        self._partial = PartialRollout(self.rollout, staleness) if staleness > 0 else None
        self._prefetch: tuple[int, PendingBatch] | None = None

    @property
    def partial(self) -> bool:
        """Whether batches generate across weight pushes (partial rollout)."""
        return self._partial is not None

    def generate_sequences(self, prompts: DataProto, *, batch_id: str | None = None) -> DataProto:
        """The rollout worker's ``generate_sequences``, on the servers (requests named
        ``<batch_id>-<row>``; a fresh id by default)."""
        return self.rollout.generate_sequences(prompts, batch_id=batch_id)

    def take(
        self, step: int, last_step: int, make_batch: Callable[[int], DataProto]
    ) -> tuple[DataProto, int]:
        """Partial rollout: step ``step``'s batch (prompts from ``make_batch(step)``), within
        the staleness bound, and the next step's generation started unless ``step`` is
        ``last_step`` (it runs across this step's weight push). The batch trains the actor
        from version ``step - 1``; returns it and its staleness, that minus its oldest
        version."""
        if self._partial is None:
            raise TrainerStateError("ServerRollout.take: the servers run no partial rollout")
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None and prefetch[0] != step:  # a recovery or resume moved the step
            prefetch[1].abort()
            prefetch = None
        if prefetch is None:
            prefetch = (step, self._partial.submit(make_batch(step), batch_id=f"s{step}"))
        batch = self._partial.take(prefetch[1], actor_version=step - 1)
        if step < last_step:
            nxt = step + 1
            self._prefetch = (nxt, self._partial.submit(make_batch(nxt), batch_id=f"s{nxt}"))
        return batch, (step - 1) - int(batch.meta_info["weight_version"])

    def push_weights(self, actor: WorkerGroup[ActorRolloutRefWorker], version: int) -> None:
        """Export the actor's weights as ``version`` and load them in every server."""
        folder = self.weights_dir / f"v{version}"
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        actor.export_hf_model(str(folder))
        self.fleet.router.push_weights(WeightUpdate(version=version, path=str(folder)))
        self._prune(version)

    def _prune(self, newest: int) -> None:
        for old in self.weights_dir.glob("v*"):
            suffix = old.name[1:]
            if suffix.isdigit() and int(suffix) <= newest - _KEEP_VERSIONS:
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        """Abort the generation in flight, then stop the pool and the servers."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None:
            prefetch[1].abort()
        try:
            self.rollout.close()
        finally:
            self.fleet.close()
