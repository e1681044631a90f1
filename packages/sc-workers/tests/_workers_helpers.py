"""Batches, configs and a multi-process launcher shared by the sc-workers tests."""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch
from sc_protocol import DataProto
from sc_workers import (
    ActorConfig,
    ActorRolloutRefConfig,
    ActorRolloutRefWorker,
    CriticConfig,
    CriticWorker,
    Engine,
    FSDPConfig,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
    RefConfig,
    RolloutConfig,
)
from tensordict import TensorDict
from torch.distributed.tensor import DTensor

PROMPT_LEN = 5
RESP_LEN = 4
BATCH = 8
EOS_IDS = list(range(3, 32, 4))


def tiny_model() -> ModelConfig:
    return ModelConfig(
        vocab_size=32,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        seed=7,
    )


Strategy = Literal["fsdp", "fsdp2", "megatron"]


def actor_config(
    strategy: Strategy = "fsdp",
    tp: int = 1,
    mini: int = 4,
    micro: int = 1,
    shuffle: bool = False,
) -> ActorRolloutRefConfig:
    fsdp = FSDPConfig(param_dtype="float32")
    meg = MegatronConfig(tensor_model_parallel_size=tp)
    return ActorRolloutRefConfig(
        model=tiny_model(),
        actor=ActorConfig(
            strategy=strategy,
            ppo_mini_batch_size=mini,
            ppo_micro_batch_size_per_gpu=micro,
            ppo_epochs=1,
            shuffle=shuffle,
            entropy_coeff=0.01,
            use_kl_loss=True,
            kl_loss_coef=0.1,
            grad_clip=1.0,
            optim=OptimConfig(lr=1e-2, eps=1e-6, lr_warmup_steps=1, weight_decay=0.0),
            fsdp_config=fsdp,
            megatron=meg,
        ),
        rollout=RolloutConfig(response_length=RESP_LEN, log_prob_micro_batch_size_per_gpu=2),
        ref=RefConfig(strategy=strategy, fsdp_config=fsdp, megatron=meg),
        device="cpu",
    )


def critic_config(
    strategy: Strategy = "fsdp", tp: int = 1, mini: int = 4, micro: int = 1
) -> CriticConfig:
    return CriticConfig(
        model=tiny_model(),
        strategy=strategy,
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size_per_gpu=micro,
        forward_micro_batch_size_per_gpu=2,
        cliprange_value=0.5,
        optim=OptimConfig(lr=1e-2, eps=1e-6, weight_decay=0.0),
        fsdp_config=FSDPConfig(param_dtype="float32"),
        megatron=MegatronConfig(tensor_model_parallel_size=tp),
        device="cpu",
    )


def make_tensors(batch: int = BATCH, seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded responses, and the PPO columns, reproducibly."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, 32, (batch, PROMPT_LEN), generator=g)
    responses = torch.randint(2, 32, (batch, RESP_LEN), generator=g)
    prompt_mask = torch.ones(batch, PROMPT_LEN, dtype=torch.long)
    response_mask = torch.ones(batch, RESP_LEN, dtype=torch.long)
    for i in range(batch):
        pad = i % 3
        prompt_mask[i, :pad] = 0
        prompts[i, :pad] = 0
        cut = RESP_LEN - (i % 2) - (i % 4 == 3)
        response_mask[i, cut:] = 0
        responses[i, cut:] = 0
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "old_log_probs": -3.0 + 0.1 * torch.randn(batch, RESP_LEN, generator=g),
        "ref_log_prob": -3.0 + 0.1 * torch.randn(batch, RESP_LEN, generator=g),
        "advantages": torch.randn(batch, RESP_LEN, generator=g),
        "values": 0.1 * torch.randn(batch, RESP_LEN, generator=g),
        "returns": torch.randn(batch, RESP_LEN, generator=g),
    }


def prompt_batch(n: int = 4, **meta: Any) -> DataProto:
    """``n`` left-padded prompts (with a ``uid`` column) for ``generate_sequences``."""
    t = make_tensors(n)
    mask = t["attention_mask"][:, :PROMPT_LEN]
    return DataProto.from_dict(
        tensors={
            "input_ids": t["prompts"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        },
        non_tensors={"uid": np.array([f"p{i}" for i in range(n)], dtype=object)},
        meta_info=meta,
    )


def proto(tensors: dict[str, torch.Tensor], **meta: Any) -> DataProto:
    return DataProto.from_dict(tensors=tensors, meta_info=meta)


def col(data: DataProto, key: str) -> torch.Tensor:
    """One tensor column of a DataProto (which must have tensors)."""
    if data.batch is None:
        raise AssertionError(f"the DataProto has no tensors (wanted {key!r})")
    value = data.batch[key]
    if not isinstance(value, torch.Tensor):
        raise AssertionError(f"{key!r} is a {type(value).__name__}")
    return value


def rows(tensors: dict[str, torch.Tensor], index: torch.Tensor | slice) -> dict[str, torch.Tensor]:
    return {k: v[index] for k, v in tensors.items()}


def per_rank(monkeypatch: pytest.MonkeyPatch, world: int, make: Callable[[], Any]) -> list[Any]:
    """``make()`` once per rank of a group of ``world``, each under that rank's
    ``WORLD_SIZE`` and ``RANK`` (one process holding a whole group's workers)."""
    out = []
    for rank in range(world):
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("RANK", str(rank))
        out.append(make())
    return out


def dp_share(tensors: dict[str, torch.Tensor], layout: Any) -> dict[str, torch.Tensor]:
    """The rows of ``tensors`` (``BATCH`` of them) that ``layout``'s dp rank takes."""
    share = BATCH // layout.dp_size
    return rows(tensors, slice(layout.dp_rank * share, (layout.dp_rank + 1) * share))


def started_workers(
    actor_cfg: ActorRolloutRefConfig,
    critic_cfg: CriticConfig,
    tensors: dict[str, torch.Tensor] | None = None,
) -> tuple[ActorRolloutRefWorker, CriticWorker, dict[str, torch.Tensor]]:
    """An actor (role ``actor_rollout_ref``) and a critic, their models built, and this
    rank's share (:func:`dp_share`) of ``tensors`` (default :func:`make_tensors`)."""
    actor = ActorRolloutRefWorker(actor_cfg, "actor_rollout_ref")
    critic = CriticWorker(critic_cfg)
    mine = dp_share(make_tensors() if tensors is None else tensors, actor.layout)
    actor.init_model()
    critic.init_model()
    return actor, critic, mine


def _metadata_only(data: DataProto) -> DataProto:
    """What the dispatch sends a rank registered with ``receives_data=False``."""
    return DataProto(batch=TensorDict({}, batch_size=[len(data)]), meta_info=data.meta_info)


def dp_mini_batch_order(batch: int, dp: int, per_rank_mini: int) -> torch.Tensor:
    """Row order under which one process sees the same mini-batches as ``dp`` ranks do.

    Rank d holds rows [d*s, (d+1)*s) (s = batch / dp) and cuts them into mini-batches of
    ``per_rank_mini`` rows; mini-batch m of the whole group is the union over ranks.
    """
    shard = batch // dp
    order: list[int] = []
    for m in range(shard // per_rank_mini):
        for d in range(dp):
            start = d * shard + m * per_rank_mini
            order.extend(range(start, start + per_rank_mini))
    return torch.tensor(order)


def full_weights(engine: Engine | None) -> dict[str, torch.Tensor]:
    """Every parameter gathered to a full CPU tensor (a collective: call on every rank)."""
    if engine is None:
        raise AssertionError("the worker has no engine; call init_model first")
    out: dict[str, torch.Tensor] = {}
    for name, p in engine.module.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out[name] = t.detach().cpu().clone()
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(
    rank: int,
    fn: Callable[[int, int, Path], None],
    world: int,
    port: int,
    out: str,
    device: str,
) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        SC_WORKERS_DEVICE=device,
    )
    fn(rank, world, Path(out))


def launch(
    fn: Callable[[int, int, Path], None],
    world: int,
    out: Path,
    timeout: float,
    device: str = "cpu",
) -> None:
    """Run ``fn(rank, world, out)`` in ``world`` spawned processes (gloo on CPU; with
    ``device="cuda"``, nccl and one GPU per rank); fail on timeout."""
    # A fork server imports torch and sc-workers once (preloaded) and forks each rank from
    # that clean, single-threaded process: fresh interpreters like "spawn", without paying
    # the imports once per rank (which dominates the run time on a small machine). It also
    # preloads transformers through the HF helpers (skipped, when transformers is missing).
    ctx: multiprocessing.context.BaseContext
    if "forkserver" in multiprocessing.get_all_start_methods():
        server = multiprocessing.get_context("forkserver")
        server.set_forkserver_preload(["_workers_helpers", "_workers_hf_helpers"])
        ctx = server
    else:  # pragma: no cover - Windows
        ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(rank, fn, world, port, str(out), device), daemon=True)
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
        if hung:
            raise TimeoutError(f"ranks {hung} of {world} did not finish within {timeout} s")
        failed = {rank: p.exitcode for rank, p in enumerate(procs) if p.exitcode != 0}
        if failed:
            raise RuntimeError(f"worker processes exited with codes {failed} (rank: code)")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)


def greedy_prompts(tensors: dict[str, torch.Tensor]) -> DataProto:
    """The prompts of ``tensors`` for greedy decoding with a few eos tokens: sequences (and
    ranks) finish at different steps."""
    prompt_mask = tensors["attention_mask"][:, :PROMPT_LEN]
    return proto(
        {
            "input_ids": tensors["prompts"],
            "attention_mask": prompt_mask,
            "position_ids": (prompt_mask.cumsum(-1) - 1).clamp(min=0),
        },
        do_sample=False,
        eos_token_id=EOS_IDS,
        response_length=6,
    )


def run_pipeline(
    actor: Any,
    critic: Any,
    tensors: dict[str, torch.Tensor],
    update_order: torch.Tensor | None,
    reads_batch: bool = True,
    entropys: bool = False,
) -> dict[str, Any]:
    """Greedy generation; log-prob, ref log-prob, one actor update, log-prob again; values
    and one critic update.

    ``update_order`` reorders the rows given to the updates (the single-process reference
    uses it to see the same mini-batches as the dp ranks). With ``reads_batch=False`` (a
    middle pipeline stage) the scoring and training calls get the batch's metadata only, as
    the dispatch sends it; ``entropys`` adds the entropies of a second log-prob call.
    """
    upd = tensors if update_order is None else rows(tensors, update_order)
    out: dict[str, Any] = {}

    def batch(t: dict[str, torch.Tensor], **meta: Any) -> DataProto:
        data = proto(t, **meta)
        return data if reads_batch else _metadata_only(data)

    gen = actor.generate_sequences(greedy_prompts(tensors))  # through the stages, if any
    out["gen_responses"] = col(gen, "responses")
    out["gen_mask"] = col(gen, "response_mask")
    out["old_log_probs"] = actor.compute_log_prob(batch(tensors, temperature=1.0)).batch[
        "old_log_probs"
    ]
    if entropys:
        out["entropys"] = actor.compute_log_prob(batch(tensors)).batch["entropys"]
    out["ref_log_prob"] = actor.compute_ref_log_prob(batch(tensors)).batch["ref_log_prob"]
    out["actor_metrics"] = actor.update_actor(batch(upd, temperature=1.0)).meta_info["metrics"]
    out["actor_weights"] = full_weights(actor.actor_engine)
    out["new_log_probs"] = actor.compute_log_prob(batch(tensors)).batch["old_log_probs"]
    out["values"] = critic.compute_values(batch(tensors)).batch["values"]
    out["critic_metrics"] = critic.update_critic(batch(upd)).meta_info["metrics"]
    out["critic_weights"] = full_weights(critic.critic_engine)
    return out


def parallel_job(strategy: Strategy, tp: int, rank: int, world: int, out: Path) -> None:
    """One rank of the dp / tp x dp correctness runs (started by ``launch``)."""
    import torch.distributed as dist

    actor, critic, mine = started_workers(actor_config(strategy, tp), critic_config(strategy, tp))
    result = run_pipeline(actor, critic, mine, None)
    result["mesh"] = {
        name: (actor._query_dispatch_info(name), actor._query_collect_info(name))
        for name in ("actor", "rollout", "ref")
    }
    result["mesh"]["critic"] = (
        critic._query_dispatch_info("critic"),
        critic._query_collect_info("critic"),
    )
    if strategy == "fsdp":
        result.update(_hsdp_and_resume(actor, mine, out))
    torch.save(result, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _hsdp_and_resume(actor: Any, mine: dict[str, torch.Tensor], out: Path) -> dict[str, Any]:
    """HSDP (fsdp_size 1: replicate x 2) makes the same first update; a sharded checkpoint
    saved by 2 ranks resumes to the same second update."""
    import dataclasses

    cfg = actor_config()
    hsdp_fsdp = dataclasses.replace(cfg.actor.fsdp_config, fsdp_size=1)
    hsdp_cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, fsdp_config=hsdp_fsdp))
    hsdp = ActorRolloutRefWorker(hsdp_cfg, "actor")
    hsdp.init_model()
    hsdp.update_actor(proto(mine, temperature=1.0))
    result: dict[str, Any] = {"hsdp_actor_weights": full_weights(hsdp.actor_engine)}

    second = rows(make_tensors(BATCH, seed=9), slice(0, BATCH // 2))
    path = str(out / "ckpt")
    actor.save_checkpoint(path, global_step=1)
    expected = actor.update_actor(proto(second)).meta_info["metrics"]
    expected_weights = full_weights(actor.actor_engine)
    fresh = ActorRolloutRefWorker(cfg, "actor")
    fresh.init_model()
    fresh.load_checkpoint(path)
    got = fresh.update_actor(proto(second)).meta_info["metrics"]
    got_weights = full_weights(fresh.actor_engine)
    result["resume_metrics_equal"] = got == expected
    result["resume_weights_equal"] = all(
        torch.equal(got_weights[k], v) for k, v in expected_weights.items()
    )
    root = Path(path)
    result["ckpt_root"] = sorted(p.name for p in root.iterdir())
    published = (root / "CURRENT").read_text().strip()
    result["ckpt_files"] = sorted(p.name for p in (root / published).iterdir())
    return result
