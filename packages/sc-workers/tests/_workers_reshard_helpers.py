"""Checkpoints saved at one parallel layout and loaded at another (started by ``launch``).

Every layout sees the same global mini-batches: the canonical mini-batch ``m`` is rows
``[4m, 4m + 4)`` of a batch, and :func:`arranged` reorders the batch so that a layout's dp
ranks, each cutting its rows into mini-batches, put exactly those rows together.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _workers_helpers import (
    BATCH,
    Strategy,
    actor_config,
    critic_config,
    dp_mini_batch_order,
    full_weights,
    make_tensors,
    proto,
    rows,
)
from sc_workers import (
    ActorRolloutRefConfig,
    ActorRolloutRefWorker,
    CriticConfig,
    CriticWorker,
)

#: the global mini-batch size of the actor and the critic (``actor_config``, ``critic_config``)
MINI = 4
#: the batches of the update before the save and of the update after the load
FIRST_SEED, SECOND_SEED = 1, 2
#: (kind, strategy, tp, checkpoint name, result name): the steps of one launch
Step = tuple[str, Strategy, int, str, str]


def configs(strategy: Strategy, tp: int, pp: int = 1) -> tuple[ActorRolloutRefConfig, CriticConfig]:
    """The helpers' actor and critic with a 3-step warmup (the lr schedule must resume), on
    ``pp`` pipeline stages (megatron)."""
    actor = actor_config(strategy, tp)
    optim = dataclasses.replace(actor.actor.optim, lr_warmup_steps=3)
    meg = dataclasses.replace(actor.actor.megatron, pipeline_model_parallel_size=pp)
    actor = dataclasses.replace(
        actor,
        actor=dataclasses.replace(actor.actor, optim=optim, megatron=meg),
        ref=dataclasses.replace(actor.ref, megatron=meg),
    )
    critic = critic_config(strategy, tp)
    critic = dataclasses.replace(
        critic,
        optim=dataclasses.replace(critic.optim, lr_warmup_steps=3),
        megatron=dataclasses.replace(critic.megatron, pipeline_model_parallel_size=pp),
    )
    return actor, critic


def arranged(seed: int, dp: int) -> dict[str, torch.Tensor]:
    """Batch ``seed`` reordered so that ``dp`` ranks form the canonical mini-batches."""
    order = dp_mini_batch_order(BATCH, dp, MINI // dp)
    return rows(make_tensors(BATCH, seed=seed), torch.argsort(order))


def my_rows(seed: int, dp: int, dp_rank: int) -> dict[str, torch.Tensor]:
    shard = BATCH // dp
    return rows(arranged(seed, dp), slice(dp_rank * shard, (dp_rank + 1) * shard))


def _workers(
    strategy: Strategy, tp: int, pp: int = 1
) -> tuple[ActorRolloutRefWorker, CriticWorker]:
    actor_cfg, critic_cfg = configs(strategy, tp, pp)
    actor = ActorRolloutRefWorker(actor_cfg, "actor")
    critic = CriticWorker(critic_cfg)
    actor.init_model()
    critic.init_model()
    return actor, critic


def _weights(actor: ActorRolloutRefWorker, critic: CriticWorker) -> dict[str, torch.Tensor]:
    out = {f"actor.{k}": v for k, v in full_weights(actor.actor_engine).items()}
    out.update({f"critic.{k}": v for k, v in full_weights(critic.critic_engine).items()})
    if actor.layout.pp_size == 1:
        return out
    # each pipeline stage holds its own layers: every rank gets the whole model's
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, out)
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        merged.update(part)
    return merged  # stage by stage: the unsplit model's order


def _actor_names(weights: dict[str, torch.Tensor]) -> list[str]:
    """The actor's parameter names, in the module's order."""
    return [name.removeprefix("actor.") for name in weights if name.startswith("actor.")]


def _update(actor: ActorRolloutRefWorker, critic: CriticWorker, seed: int) -> dict[str, Any]:
    layout = actor.layout
    mine = my_rows(seed, layout.dp_size, layout.dp_rank)
    metrics = dict(actor.update_actor(proto(mine, temperature=1.0)).meta_info["metrics"])
    metrics.update(critic.update_critic(proto(mine)).meta_info["metrics"])
    if layout.pp_size > 1:  # the losses' metrics live on the last stage: its first rank's
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, metrics)
        metrics = parts[(layout.pp_size - 1) * layout.dp_size * layout.tp_size]
    return {"metrics": metrics, "weights": _weights(actor, critic)}


def train_and_save(strategy: Strategy, tp: int, ckpt: Path, pp: int = 1) -> dict[str, Any]:
    """One update, a checkpoint, and the next update of the run that never changed layout."""
    actor, critic = _workers(strategy, tp, pp)
    _update(actor, critic, FIRST_SEED)
    actor.save_checkpoint(str(ckpt / "actor"), global_step=1)
    critic.save_checkpoint(str(ckpt / "critic"), global_step=1)
    saved = _weights(actor, critic)
    result = _update(actor, critic, SECOND_SEED)
    result["saved"] = saved
    result["names"] = _actor_names(saved)
    return result


def load_and_update(strategy: Strategy, tp: int, ckpt: Path, pp: int = 1) -> dict[str, Any]:
    """Fresh workers at another layout load the checkpoint and make the next update."""
    actor, critic = _workers(strategy, tp, pp)
    actor.load_checkpoint(str(ckpt / "actor"))
    critic.load_checkpoint(str(ckpt / "critic"))
    loaded = _weights(actor, critic)
    result = _update(actor, critic, SECOND_SEED)
    result["loaded"] = loaded
    result["names"] = _actor_names(loaded)
    return result


def pipeline_reshard_job(
    steps: list[tuple[str, int, int, str, str]], rank: int, world: int, out: Path
) -> None:
    """As :func:`reshard_job` on the megatron engine, each step ``(kind, tp, pp,
    checkpoint, result)`` at ``pp`` pipeline stages."""
    for kind, tp, pp, ckpt, name in steps:
        run = train_and_save if kind == "save" else load_and_update
        result = run("megatron", tp, out / ckpt, pp)
        if rank == 0:
            torch.save(result, out / f"{name}.pt")
        dist.barrier()
    dist.destroy_process_group()


def reshard_job(steps: list[Step], rank: int, world: int, out: Path) -> None:
    """Run ``steps`` in order: ("save", strategy, tp, checkpoint, result) trains and saves,
    ("load", ...) loads the checkpoint at this layout; rank 0 writes each result."""
    for kind, strategy, tp, ckpt, name in steps:
        run = train_and_save if kind == "save" else load_and_update
        result = run(strategy, tp, out / ckpt)
        if rank == 0:
            torch.save(result, out / f"{name}.pt")
        dist.barrier()
    dist.destroy_process_group()
