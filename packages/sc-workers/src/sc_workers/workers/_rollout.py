"""``RolloutWorker``: sampling on a group of its own, with its own layout, fed by weight sync."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from sc_dispatch import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from sc_protocol import DataProto

from .._config import ActorRolloutRefConfig, ParallelSizes
from .._errors import ConfigError, NotInitializedError
from ..engine import Engine, ReplicatedTPEngine
from ._collective import collective, collective_setup
from ._common import KeptState, WorkerBase, worker_config
from ._generation import generate_batch, sampling_params
from ._sync import WeightSyncEndpoint

__all__ = ["RolloutWorker"]

logger = logging.getLogger(__name__)


class RolloutWorker(WeightSyncEndpoint, WorkerBase):
    """Generation on a separately placed group: the model split over
    ``rollout.tensor_model_parallel_size`` ranks, full copies (replicas) over the rest.

    The group registers the mesh "rollout" (dp rank = replica, tp rank 0 collects), so
    ``generate_sequences`` splits a batch over the replicas. Its weights come from the trainer
    through :class:`~sc_workers.WeightSync` (``sync_*`` methods): each sync has a version, the
    incoming version is staged and switched to on every rank at once, and every generated
    batch carries the version it was generated with in ``meta_info["weight_version"]`` (0:
    the initial weights, before any sync).
    """

    def __init__(self, config: ActorRolloutRefConfig | Mapping[str, Any]) -> None:
        super().__init__()
        config = worker_config(ActorRolloutRefConfig, config, "RolloutWorker")
        self.config = config
        tp = config.rollout.tensor_model_parallel_size
        if self.world_size % tp:
            raise ConfigError(
                f"RolloutWorker: rollout.tensor_model_parallel_size {tp} does not divide the "
                f"group's world size {self.world_size}"
            )
        self._setup_identity(config.device, ParallelSizes(tp=tp))
        self._register_dispatch_collect_info(
            "rollout", dp_rank=self.layout.dp_rank, is_collect=self.layout.is_collect
        )
        self.rollout_engine: Engine | None = None
        self._generator: torch.Generator | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @collective_setup
    def init_model(self) -> None:
        """Join the process group and build the model (tensor parallel, no optimizer)."""
        if self.rollout_engine is not None:
            return
        self._generator = self._init_sampling(self.config.rollout.seed)

    def _build_engines(self, kept: KeptState | None = None) -> None:
        cfg = self.config
        engine = ReplicatedTPEngine(cfg.model, cfg.actor.fsdp_config, self.layout, self.device)
        engine.build()
        self._restore_engine(engine, "rollout_engine", kept)
        engine.eval_mode()
        self.rollout_engine = engine

    def _sync_engine(self, method: str) -> Engine:
        if self.rollout_engine is None:
            raise NotInitializedError(f"{self._where(method)}: call init_model first")
        return self.rollout_engine

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout"))
    @collective
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """As ``ActorRolloutRefWorker.generate_sequences``, tagged with the weight version."""
        where = self._where("generate_sequences")
        engine = self._sync_engine("generate_sequences")
        if self._generator is None:
            raise NotInitializedError(f"{where}: call init_model first")
        params = sampling_params(prompts.meta_info, self.config.rollout, self.config.model, where)
        out = generate_batch(engine, self._generator, prompts, params, where)
        out.meta_info["weight_version"] = self.weight_version
        return out
