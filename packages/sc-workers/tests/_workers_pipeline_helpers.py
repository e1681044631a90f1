"""Configs and the per-rank job of the pipeline-parallel equivalence tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from _workers_helpers import (
    actor_config,
    critic_config,
    make_tensors,
    run_pipeline,
    started_workers,
)
from _workers_helpers import proto as make_proto
from sc_workers import (
    ActorRolloutRefConfig,
    ActorRolloutRefWorker,
    CriticConfig,
    MegatronConfig,
)

#: four decoder layers: two stages of two, or four virtual stages of one
LAYERS = 4


@dataclasses.dataclass(frozen=True)
class Layout:
    """One pipelined layout under test (world = pp x dp x tp)."""

    pp: int = 1
    tp: int = 1
    dp: int = 1
    vpp: int = 1
    schedule: str = "auto"
    #: the batch carries a ``banned_token_ids`` column (:func:`with_bans`)
    banned: bool = False

    @property
    def world(self) -> int:
        return self.pp * self.tp * self.dp

    def megatron(self) -> MegatronConfig:
        return MegatronConfig(
            tensor_model_parallel_size=self.tp,
            pipeline_model_parallel_size=self.pp,
            virtual_pipeline_model_parallel_size=self.vpp if self.vpp > 1 else None,
            pipeline_schedule=self.schedule,  # type: ignore[arg-type]  # a checked Literal
        )


def configs(layout: Layout | None) -> tuple[ActorRolloutRefConfig, CriticConfig]:
    """The actor and critic of the equivalence tests; ``None``: the single-rank reference
    (strategy fsdp, world size 1)."""
    actor = actor_config("fsdp" if layout is None else "megatron")
    critic = critic_config("fsdp" if layout is None else "megatron")
    model = dataclasses.replace(actor.model, num_hidden_layers=LAYERS)
    actor = dataclasses.replace(actor, model=model)
    critic = dataclasses.replace(critic, model=model)
    if layout is None:
        return actor, critic
    meg = layout.megatron()
    actor = dataclasses.replace(
        actor,
        actor=dataclasses.replace(actor.actor, megatron=meg),
        ref=dataclasses.replace(actor.ref, megatron=meg),
    )
    return actor, dataclasses.replace(critic, megatron=meg)


def with_bans(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` plus a ``banned_token_ids`` column ``[batch, response_length, 2]``: one or
    two ids banned at every other response position (never the position's own token), -1
    elsewhere."""
    responses = tensors["responses"]
    rows_, length = responses.shape
    banned = torch.full((rows_, length, 2), -1, dtype=torch.long)
    for r in range(rows_):
        for p in range(0, length, 2):
            others = [v for v in range(32) if v != int(responses[r, p])]
            banned[r, p, 0] = others[(3 * r + p) % len(others)]
            if p % 4 == 0:
                banned[r, p, 1] = others[(3 * r + p + 7) % len(others)]
    return {**tensors, "banned_token_ids": banned}


def pipeline_job(layout: Layout, rank: int, world: int, out: Path) -> None:
    """One rank of a pipelined run (started by ``launch``)."""
    import torch.distributed as dist

    actor_cfg, critic_cfg = configs(layout)
    tensors = with_bans(make_tensors()) if layout.banned else make_tensors()
    actor, critic, mine = started_workers(actor_cfg, critic_cfg, tensors)
    lay = actor.layout
    result = run_pipeline(actor, critic, mine, None, reads_batch=lay.reads_batch, entropys=True)
    result["layout"] = (lay.pp_rank, lay.dp_rank, lay.tp_rank, lay.is_collect)
    result["mesh"] = {
        name: (
            worker._query_dispatch_info(name),
            worker._query_collect_info(name),
            worker._query_receives_data_info(name),
        )
        for worker, name in (
            (actor, "actor"),
            (actor, "ref"),
            (actor, "rollout"),
            (critic, "critic"),
        )
    }
    torch.save(result, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def failure_job(method: str, rank: int, world: int, out: Path) -> None:
    """PP=2: the last stage gets a response token outside the vocabulary (its head fails
    inside the schedule) while the first stage has nothing wrong; record how each rank's
    call ended and how long it took, then whether the pipeline still runs."""
    import time

    import torch.distributed as dist

    actor_cfg, _ = configs(Layout(pp=2))
    actor = ActorRolloutRefWorker(actor_cfg, "actor_rollout_ref")
    actor.init_model()
    tensors = make_tensors()
    if actor.layout.is_last_stage:
        tensors["responses"] = tensors["responses"].clone()
        tensors["responses"][3, 1] = 10_000  # not a token of the 32-token vocabulary
    call = getattr(actor, method)
    start = time.monotonic()
    try:
        call(make_proto(tensors, temperature=1.0))
        outcome = ("ok", "")
    except Exception as exc:
        outcome = (type(exc).__name__, str(exc))
    elapsed = time.monotonic() - start
    if not actor.layout.is_last_stage:
        (out / "rank0.released").touch()
    else:
        # the failed stage stays alive (holding whatever it holds) until its peer's call
        # has ended: the peer must not depend on this process exiting
        done = out / "rank0.released"
        deadline = time.monotonic() + 90
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    try:
        actor.compute_log_prob(make_proto(make_tensors()))
        after = ("ok", "")
    except Exception as exc:
        after = (type(exc).__name__, str(exc))
    result = {"outcome": outcome, "elapsed": elapsed, "after": after}
    torch.save(result, out / f"rank{rank}.tmp")
    (out / f"rank{rank}.tmp").rename(out / f"rank{rank}.pt")
    dist.destroy_process_group()
