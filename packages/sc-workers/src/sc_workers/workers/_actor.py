"""``ActorRolloutRefWorker``: the policy (actor), its sampler (rollout) and the reference."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from sc_dispatch import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from sc_protocol import DataProto

from .._config import ActorRolloutRefConfig, BatchSizes
from .._errors import ConfigError, NotInitializedError
from ..engine import Engine, PipelineEngine, make_engine
from ._collective import collective, collective_setup
from ._common import KeptState, WorkerBase, worker_config
from ._generation import generate_batch, meta_float, sampling_params
from ._ppo import BANNED, check_banned, compute_log_prob, gather_tensors, update_policy
from ._ppo_pipeline import pipelined_log_prob, pipelined_update_policy
from ._sync import WeightSyncEndpoint

__all__ = ["ROLES", "ActorRolloutRefWorker"]

logger = logging.getLogger(__name__)

#: role -> (actor, rollout, ref)
ROLES: dict[str, tuple[bool, bool, bool]] = {
    "actor": (True, False, False),
    "rollout": (False, True, False),
    "ref": (False, False, True),
    "actor_rollout": (True, True, False),
    "actor_rollout_ref": (True, True, True),
}

_MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses")


class ActorRolloutRefWorker(WeightSyncEndpoint, WorkerBase):
    """verl's hybrid worker: one model for training (actor) and sampling (rollout), plus an
    optional frozen reference model (ref), on the FSDP or megatron-style engine.

    ``role`` is "actor", "rollout", "ref", "actor_rollout" or "actor_rollout_ref". The
    worker registers the meshes "actor", "rollout" and "ref" that its role includes: on
    each, its dp rank and whether it returns outputs (tp rank 0). The data methods use
    ``make_nd_compute_dataproto_dispatch_fn`` on those meshes, so a worker group splits a
    batch by dp rank and collects one output per dp group.

    Its actor's weights can be sent to a separately placed :class:`~sc_workers.RolloutWorker`
    group (the ``sync_*`` methods, driven by :class:`~sc_workers.WeightSync`).
    """

    def __init__(self, config: ActorRolloutRefConfig | Mapping[str, Any], role: str) -> None:
        super().__init__()
        config = worker_config(ActorRolloutRefConfig, config, "ActorRolloutRefWorker")
        if role not in ROLES:
            raise ConfigError(
                f"ActorRolloutRefWorker: role must be one of {sorted(ROLES)}, got {role!r}"
            )
        self.config = config
        self.role = role
        self._is_actor, self._is_rollout, self._is_ref = ROLES[role]
        uses_actor_model = self._is_actor or self._is_rollout
        section = config.actor if uses_actor_model else config.ref
        self._setup_identity(config.device, section.parallel_sizes)
        self.actor_batch_sizes: BatchSizes | None = None
        if self._is_actor:
            self.actor_batch_sizes = config.actor.normalized_batch_sizes(
                config.rollout.n, self.layout.dp_size
            )
        # "rollout": every pipeline stage samples (each needs the prompts); "actor" and
        # "ref": a middle stage gets its inputs from the previous stage, not the batch
        for mesh, present, reads in (
            ("actor", self._is_actor, self.layout.reads_batch),
            ("rollout", self._is_rollout, True),
            ("ref", self._is_ref, self.layout.reads_batch),
        ):
            if present:
                self._register_dispatch_collect_info(
                    mesh,
                    dp_rank=self.layout.dp_rank,
                    is_collect=self.layout.is_collect,
                    receives_data=reads,
                )
        self.actor_engine: Engine | None = None
        self.ref_engine: Engine | None = None
        self._generator: torch.Generator | None = None

    # ------------------------------------------------------------------ setup
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @collective_setup
    def init_model(self) -> None:
        """Join the process group and build the engines the role needs (idempotent)."""
        if self.actor_engine is not None or self.ref_engine is not None:
            return
        self._generator = self._init_sampling(self.config.rollout.seed)

    def _build_engines(self, kept: KeptState | None = None) -> None:
        cfg = self.config
        if self._is_actor or self._is_rollout:
            optim = cfg.actor.optim if self._is_actor else None
            engine = make_engine(
                cfg.actor.strategy,
                cfg.model,
                cfg.actor.fsdp_config,
                self.layout,
                self.device,
                optim,
                megatron=cfg.actor.megatron,
            )
            engine.build()
            self._restore_engine(engine, "actor_engine", kept)
            if cfg.actor.fsdp_config.param_offload:
                engine.offload_params()
            if cfg.actor.fsdp_config.optimizer_offload:
                engine.offload_optimizer()
            self.actor_engine = engine
        if self._is_ref:
            ref = make_engine(
                cfg.ref.strategy,
                cfg.model,
                cfg.ref.fsdp_config,
                self.layout,
                self.device,
                megatron=cfg.ref.megatron,
            )
            ref.build()
            self._restore_engine(ref, "ref_engine", kept)
            if cfg.ref.fsdp_config.param_offload:
                ref.offload_params()
            self.ref_engine = ref

    def _sync_engine(self, method: str) -> Engine:
        return self._actor(method)

    def _actor(self, method: str) -> Engine:
        if not self._is_actor:
            raise NotInitializedError(f"{self._where(method)}: role {self.role!r} has no actor")
        if self.actor_engine is None:
            raise NotInitializedError(f"{self._where(method)}: call init_model first")
        return self.actor_engine

    # ---------------------------------------------------------------- rollout
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout"))
    @collective
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample responses for left-padded prompts (``input_ids``, ``attention_mask``,
        ``position_ids``).

        ``meta_info`` may override the rollout config: ``temperature``, ``top_k``, ``top_p``,
        ``do_sample``, ``response_length`` (or ``max_new_tokens``), ``eos_token_id`` (int or
        list) and ``pad_token_id``. Returns ``prompts``, ``responses``, ``input_ids``
        (prompt + response), ``attention_mask``, ``position_ids``, ``response_mask`` and
        ``rollout_log_probs`` (each sampled token's log-prob under the sampling model, logits
        divided by the temperature, 0 past the mask); the non-tensor columns of the input are
        passed through.
        """
        where = self._where("generate_sequences")
        if not self._is_rollout:
            raise NotInitializedError(f"{where}: role {self.role!r} has no rollout")
        if self.actor_engine is None or self._generator is None:
            raise NotInitializedError(f"{where}: call init_model first")
        params = sampling_params(prompts.meta_info, self.config.rollout, self.config.model, where)
        return generate_batch(self.actor_engine, self._generator, prompts, params, where)

    # ---------------------------------------------------------------- log-prob
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    @collective
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` ``[batch, response_length]`` under the actor.

        Needs ``input_ids``, ``attention_mask``, ``position_ids`` and ``responses``; the
        logits are divided by ``meta_info["temperature"]`` (default: the rollout's). In the
        exact mode (``rollout.exact_window``) each row runs alone in its window, as the
        sampler's do, so these equal the sampler's ``rollout_log_probs`` bit for bit. With a
        ``banned_token_ids`` column (int64 ``[batch, response_length, K]``, -1 pads: the
        tokens each response token's sampling banned), both are those of the distribution
        renormalised over the allowed tokens, the one the sampler drew from.
        """
        where = self._where("compute_log_prob")
        engine = self._actor("compute_log_prob")
        temperature = meta_float(
            data.meta_info, "temperature", self.config.rollout.temperature, where
        )
        with engine.on_device():
            log_prob, entropy = self._log_prob(
                engine,
                data,
                temperature,
                self.config.rollout.log_prob_micro_batch_size_per_gpu,
                exact_window=self.config.rollout.exact_window,
            )
        return DataProto.from_dict(
            tensors={"old_log_probs": log_prob, "entropys": entropy},
            meta_info={"temperature": temperature},
        )

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="ref"))
    @collective
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` ``[batch, response_length]`` under the frozen reference model
        (renormalised over the allowed tokens, like the actor's, with a
        ``banned_token_ids`` column)."""
        where = self._where("compute_ref_log_prob")
        if not self._is_ref:
            raise NotInitializedError(f"{where}: role {self.role!r} has no ref")
        if self.ref_engine is None:
            raise NotInitializedError(f"{where}: call init_model first")
        temperature = meta_float(
            data.meta_info, "temperature", self.config.rollout.temperature, where
        )
        engine = self.ref_engine
        with engine.on_device():
            log_prob, _ = self._log_prob(
                engine,
                data,
                temperature,
                self.config.ref.log_prob_micro_batch_size_per_gpu,
                calculate_entropy=False,
            )
        return DataProto.from_dict(
            tensors={"ref_log_prob": log_prob}, meta_info={"temperature": temperature}
        )

    def _log_prob(
        self,
        engine: Engine,
        data: DataProto,
        temperature: float,
        micro_batch_size: int,
        calculate_entropy: bool = True,
        exact_window: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        where = self._where("compute_log_prob")
        t = gather_tensors(
            data, _MODEL_INPUTS if engine.layout.reads_batch else (), (BANNED,), where
        )
        check_banned(t, where)
        if isinstance(engine, PipelineEngine):
            length = self.config.rollout.response_length
            if "responses" in t:
                length = int(t["responses"].shape[1])
            return pipelined_log_prob(engine, t, len(data), length, temperature, micro_batch_size)
        return compute_log_prob(
            engine, t, temperature, micro_batch_size, calculate_entropy, exact_window
        )

    # ------------------------------------------------------------------ update
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    @collective
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update on this batch; returns ``meta_info["metrics"]`` (dp-reduced floats).

        Needs ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``,
        ``old_log_probs``, ``advantages`` (and ``ref_log_prob`` with ``use_kl_loss``);
        ``response_mask`` defaults to the response part of ``attention_mask``; a
        ``rollout_is_weights`` column (the rollout correction's importance weights)
        multiplies the per-token policy-gradient loss; a ``banned_token_ids`` column
        renormalises the log-probs and entropies over the allowed tokens
        (:meth:`compute_log_prob`). Metrics: ``actor/pg_loss``,
        ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``,
        ``actor/entropy``, ``actor/grad_norm``, ``actor/lr`` (the rate used),
        ``actor/ppo_ratio_first_dev_max`` (the largest ``|ratio - 1|`` of the first
        mini-batch, before any optimizer step: 0.0 when the training forward reproduces the
        ``old_log_probs`` bit for bit, as in the exact mode), and ``actor/kl_loss``,
        ``actor/kl_coef`` with the KL loss. In the exact mode (``rollout.exact_window``)
        each row's forward runs alone in its window.
        """
        where = self._where("update_actor")
        engine = self._actor("update_actor")
        cfg = self.config.actor
        keys = [*_MODEL_INPUTS, "old_log_probs", "advantages"]
        if cfg.use_kl_loss:
            keys.append("ref_log_prob")
        if not engine.layout.reads_batch:
            keys = []
        t = gather_tensors(data, keys, ("response_mask", "rollout_is_weights", BANNED), where)
        check_banned(t, where)
        temperature = meta_float(
            data.meta_info, "temperature", self.config.rollout.temperature, where
        )
        sizes = self.actor_batch_sizes
        if sizes is None:  # pragma: no cover - set in __init__ for every actor role
            raise NotInitializedError(f"{where}: no batch sizes")
        if isinstance(engine, PipelineEngine):
            rows = len(data)

            def step(seed: int) -> dict[str, float]:
                return pipelined_update_policy(
                    engine, t, rows, cfg, sizes, temperature, seed, where
                )
        else:

            def step(seed: int) -> dict[str, float]:
                return update_policy(
                    engine,
                    t,
                    cfg,
                    sizes,
                    temperature,
                    seed,
                    where,
                    self.config.rollout.exact_window,
                )

        return self._run_update(engine, "actor", cfg.data_loader_seed, step)

    # -------------------------------------------------------------- checkpoint
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
        """Save the actor's model shards, optimizer, lr schedule and RNG states atomically.

        With ``background=True`` the call returns once the state is copied to CPU memory;
        a thread writes it, and :meth:`wait_checkpoint` says when it is published.
        """
        engine = self._actor("save_checkpoint")
        gen = self._generator
        extra = {"generator": None if gen is None else gen.get_state()}
        self._save(engine, local_path, hdfs_path, global_step, max_ckpt_to_keep, extra, background)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @collective
    def export_hf_model(self, local_path: str) -> None:
        """Write the actor's current weights as a Hugging Face directory at ``local_path``.

        Loadable with ``AutoModelForCausalLM.from_pretrained`` (and as ``model.path``); the
        config, tokenizer and other side files come from ``model.path``. Needs a model
        loaded from ``model.path``; every rank gathers, rank 0 writes.
        """
        engine = self._actor("export_hf_model")
        self._export_hf(engine, local_path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @collective
    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        """Restore what :meth:`save_checkpoint` wrote, at this or any other layout (world
        size, dp/tp sizes, strategy): another layout is resharded on load."""
        engine = self._actor("load_checkpoint")
        extra = self._load(engine, local_path, hdfs_path, del_local_after_load)
        state = extra.get("generator")
        if state is not None and self._generator is not None:
            self._generator.set_state(state)
