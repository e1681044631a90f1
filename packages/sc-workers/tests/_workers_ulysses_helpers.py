"""Configurations and the per-rank job of the Ulysses sequence-parallel tests.

The job lives here, not in the test module, so that the processes ``launch`` starts can
import it by name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from _workers_helpers import (
    actor_config,
    col,
    critic_config,
    dp_share,
    full_weights,
    make_tensors,
    proto,
    run_pipeline,
    started_workers,
)
from sc_workers import (
    ActorRolloutRefConfig,
    ActorRolloutRefWorker,
    CriticConfig,
    UnsupportedParallelismError,
    hf_worker_configs,
)

HF_SEED = 3


# ----------------------------------------------------------------------------- configs
def sp_actor_config(sp: int, fsdp_size: int = -1) -> ActorRolloutRefConfig:
    cfg = actor_config()
    fsdp = dataclasses.replace(cfg.actor.fsdp_config, fsdp_size=fsdp_size)
    actor = dataclasses.replace(cfg.actor, ulysses_sequence_parallel_size=sp, fsdp_config=fsdp)
    ref = dataclasses.replace(cfg.ref, ulysses_sequence_parallel_size=sp)
    return dataclasses.replace(cfg, actor=actor, ref=ref)


def sp_critic_config(sp: int) -> CriticConfig:
    return dataclasses.replace(critic_config(), ulysses_sequence_parallel_size=sp)


def hf_configs(path: str, sp: int) -> tuple[ActorRolloutRefConfig, CriticConfig]:
    """The HF test's configs; AdamW's eps at 1e-2 (as in the HF tests: a gradient far below
    it moves its weight like SGD, so rounding noise in a tiny gradient stays noise)."""
    a_cfg, c_cfg = sp_actor_config(sp), sp_critic_config(sp)
    a_optim = dataclasses.replace(a_cfg.actor.optim, eps=1e-2)
    a_cfg = dataclasses.replace(a_cfg, actor=dataclasses.replace(a_cfg.actor, optim=a_optim))
    c_cfg = dataclasses.replace(c_cfg, optim=dataclasses.replace(c_cfg.optim, eps=1e-2))
    return hf_worker_configs(path, a_cfg, c_cfg, seed=HF_SEED)


def even_length(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch without its first prompt column: 8 tokens, no sp padding needed."""
    out = dict(t)
    for key in ("prompts", "input_ids", "attention_mask", "position_ids"):
        out[key] = t[key][:, 1:]
    return out


def pipeline(actor: Any, critic: Any, t: dict[str, torch.Tensor], order: Any) -> dict[str, Any]:
    """:func:`run_pipeline`, plus log-probs of the 8-token batch before the update."""
    even = actor.compute_log_prob(proto(even_length(t), temperature=1.0))
    out = run_pipeline(actor, critic, t, order)
    out["even_log_probs"] = col(even, "old_log_probs")
    return out


# ------------------------------------------------------------------------- rank jobs
def _run_rank(actor_cfg: Any, critic_cfg: Any) -> dict[str, Any]:
    actor, critic, mine = started_workers(actor_cfg, critic_cfg)
    out = pipeline(actor, critic, mine, None)
    engine = actor.actor_engine
    if engine is None or engine.sequence_parallel is None:
        raise AssertionError("the actor engine has no Ulysses group")
    out["sp"] = (engine.sequence_parallel.rank, engine.sequence_parallel.size)
    out["dp_group_size"] = torch.distributed.get_world_size(engine.dp_group)
    out["grad_average_ranks"] = engine.grad_average_ranks
    # every parameter is sharded over the whole world (no replication across sp ranks)
    out["param_mesh_sizes"] = {
        p.device_mesh.size() for p in engine.module.parameters() if hasattr(p, "device_mesh")
    }
    return out


def actor_only(actor_cfg: Any) -> dict[str, Any]:
    """Log-probs, one update and the weights after it, of an actor alone (every dp rank
    takes its share of the batch; the update uses the rows in order)."""
    actor = ActorRolloutRefWorker(actor_cfg, "actor")
    mine = dp_share(make_tensors(), actor.layout)
    actor.init_model()
    out: dict[str, Any] = {
        "old_log_probs": col(actor.compute_log_prob(proto(mine, temperature=1.0)), "old_log_probs")
    }
    out["actor_metrics"] = actor.update_actor(proto(mine, temperature=1.0)).meta_info["metrics"]
    out["actor_weights"] = full_weights(actor.actor_engine)
    return out


def sp_job(hf: dict[str, str] | None, rank: int, world: int, out: Path) -> None:
    """One rank of the Ulysses runs (started by ``launch``): the built-in actor and critic
    at sp 2 (dp = world / 2), then with ``hf`` the HF Qwen2 at sp 2, an actor on a Llama
    with one key/value head, and a Bloom model (no attention interface) that must be
    refused."""
    import torch.distributed as dist

    result: dict[str, Any] = {"builtin": _run_rank(sp_actor_config(2), sp_critic_config(2))}
    if hf is not None:
        result["hf"] = _run_rank(*hf_configs(hf["qwen2"], 2))
        # one key/value head: repeated to the 4 query heads before the all-to-all
        result["hf_mqa"] = actor_only(hf_configs(hf["llama_mqa"], 2)[0])
        a_cfg, _ = hf_configs(hf["bloom"], 2)
        bloom = ActorRolloutRefWorker(a_cfg, "actor")
        try:
            bloom.init_model()
        except UnsupportedParallelismError as exc:
            result["bloom_error"] = str(exc)
    torch.save(result, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
