"""``CriticWorker``: the value model of PPO."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sc_dispatch import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from sc_protocol import DataProto

from .._config import CriticConfig
from .._errors import NotInitializedError
from ..engine import Engine, PipelineEngine, make_engine
from ._collective import collective, collective_setup
from ._common import KeptState, WorkerBase, worker_config
from ._ppo import compute_values, gather_tensors, update_critic
from ._ppo_pipeline import pipelined_update_critic, pipelined_values

__all__ = ["CriticWorker"]

_MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses")


class CriticWorker(WorkerBase):
    """A value model on either engine: the built-in transformer with a scalar head, or with
    ``model.path`` a Hugging Face base model with one (:class:`~sc_workers.models.HFValueModel`).

    Registers the mesh "critic" (its dp rank; outputs from tp rank 0).
    """

    def __init__(self, config: CriticConfig | Mapping[str, Any]) -> None:
        super().__init__()
        config = worker_config(CriticConfig, config, "CriticWorker")
        self.config = config
        self._setup_identity(config.device, config.parallel_sizes)
        self.batch_sizes = config.normalized_batch_sizes(self.layout.dp_size)
        self._register_dispatch_collect_info(
            "critic",
            dp_rank=self.layout.dp_rank,
            is_collect=self.layout.is_collect,
            receives_data=self.layout.reads_batch,
        )
        self.critic_engine: Engine | None = None

    def _engine(self, method: str) -> Engine:
        if self.critic_engine is None:
            raise NotInitializedError(f"{self._where(method)}: call init_model first")
        return self.critic_engine

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @collective_setup
    def init_model(self) -> None:
        """Join the process group and build the value model with its optimizer (idempotent)."""
        if self.critic_engine is not None:
            return
        self._init_distributed()
        self._build_engines()

    def _build_engines(self, kept: KeptState | None = None) -> None:
        cfg = self.config
        engine = make_engine(
            cfg.strategy,
            cfg.model,
            cfg.fsdp_config,
            self.layout,
            self.device,
            cfg.optim,
            value_head=True,
            megatron=cfg.megatron,
        )
        engine.build()
        self._restore_engine(engine, "critic_engine", kept)
        if cfg.fsdp_config.param_offload:
            engine.offload_params()
        if cfg.fsdp_config.optimizer_offload:
            engine.offload_optimizer()
        self.critic_engine = engine

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    @collective
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` ``[batch, response_length]``, zero outside the response mask."""
        where = self._where("compute_values")
        engine = self._engine("compute_values")
        keys = _MODEL_INPUTS if engine.layout.reads_batch else ()
        t = gather_tensors(data, keys, ("response_mask",), where)
        micro = self.config.forward_micro_batch_size_per_gpu
        with engine.on_device():
            if isinstance(engine, PipelineEngine):
                length = int(t["responses"].shape[1]) if "responses" in t else 0
                values = pipelined_values(engine, t, len(data), length, micro)
            else:
                values = compute_values(engine, t, micro)
        return DataProto.from_dict(tensors={"values": values})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    @collective
    def update_critic(self, data: DataProto) -> DataProto:
        """One clipped value-loss update; returns ``meta_info["metrics"]``.

        Needs ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``,
        ``values`` (old predictions) and ``returns``. Metrics: ``critic/vf_loss``,
        ``critic/vf_clipfrac``, ``critic/vpred_mean``, ``critic/grad_norm``, ``critic/lr``.
        """
        where = self._where("update_critic")
        engine = self._engine("update_critic")
        keys = [*_MODEL_INPUTS, "values", "returns"] if engine.layout.reads_batch else []
        t = gather_tensors(data, keys, ("response_mask",), where)
        cfg, sizes = self.config, self.batch_sizes
        if isinstance(engine, PipelineEngine):
            rows = len(data)

            def step(seed: int) -> dict[str, float]:
                return pipelined_update_critic(engine, t, rows, cfg, sizes, seed, where)
        else:

            def step(seed: int) -> dict[str, float]:
                return update_critic(engine, t, cfg, sizes, seed, where)

        return self._run_update(engine, "critic", cfg.data_loader_seed, step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @collective
    def save_checkpoint(
        self,
        local_path: str,
        hdfs_path: str | None = None,
        global_step: int = 0,
        max_ckpt_to_keep: int | None = None,
        background: bool = False,
    ) -> None:
        """Save the critic's shards, optimizer, lr schedule and RNG states atomically.

        With ``background=True`` the call returns once the state is copied to CPU memory;
        a thread writes it, and :meth:`wait_checkpoint` says when it is published.
        """
        engine = self._engine("save_checkpoint")
        self._save(engine, local_path, hdfs_path, global_step, max_ckpt_to_keep, {}, background)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @collective
    def export_hf_model(self, local_path: str) -> None:
        """Write the critic as a Hugging Face directory at ``local_path``.

        Written as ``<Arch>ForTokenClassification`` with one label: it loads with
        ``AutoModelForTokenClassification.from_pretrained``, and back into a critic (head
        included) as ``model.path``. Every rank gathers, rank 0 writes.
        """
        self._export_hf(self._engine("export_hf_model"), local_path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @collective
    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        """Restore what :meth:`save_checkpoint` wrote, at this or any other layout (world
        size, dp/tp sizes, strategy): another layout is resharded on load."""
        engine = self._engine("load_checkpoint")
        self._load(engine, local_path, hdfs_path, del_local_after_load)
