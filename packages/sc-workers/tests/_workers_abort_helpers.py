"""The per-rank job of the collective-abort tests: one rank's call raises while its peer is
in (or about to enter) a collective with it; how each rank's call ended, how long it took,
and whether the next call works again on rebuilt groups with the state kept."""

from __future__ import annotations

import time
import weakref
from pathlib import Path
from typing import Any

import torch
from _workers_helpers import actor_config, col, dp_share, full_weights, make_tensors, proto
from _workers_pipeline_helpers import Layout, configs
from sc_workers import ActorRolloutRefConfig, ActorRolloutRefWorker

#: the rank whose call fails
FAILING = 1
#: a token id outside the 32-token vocabulary: the log-prob gather of the loss fails on it
BAD_TOKEN = 10_000


def case_config(case: str) -> ActorRolloutRefConfig:
    """``fsdp``: FSDP dp 2; ``tp``: megatron tp 2 (dp 1); ``pp``: megatron pp 2 (dp 1)."""
    if case == "fsdp":
        return actor_config("fsdp")
    if case == "tp":
        return actor_config("megatron", tp=2)
    if case == "pp":
        cfg, _ = configs(Layout(pp=2))
        return cfg
    raise ValueError(f"unknown case {case!r}")


def failing_batch(case: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the failing rank is given. fsdp and tp: a response token outside the vocabulary
    in its first row (its loss fails after the forward, while its peer goes on into the
    backward's reduce-scatters / all-reduces); pp: no ``advantages`` (the last stage fails
    before the schedule, while the first stage runs its forward and waits for it)."""
    bad = dict(tensors)
    if case == "pp":
        del bad["advantages"]
        return bad
    bad["responses"] = tensors["responses"].clone()
    bad["responses"][0, 0] = BAD_TOKEN
    return bad


def outcome(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {"kind": "ok"}
    return {
        "kind": type(exc).__name__,
        "message": str(exc),
        "notes": list(getattr(exc, "__notes__", [])),
        "failed_rank": getattr(exc, "failed_rank", "absent"),
        "caused_by_peer": getattr(exc, "sc_caused_by_peer", None),
    }


def abort_job(case: str, rank: int, world: int, out: Path) -> None:
    """One rank (started by ``launch``): an update where rank 1 fails, then a good update."""
    import torch.distributed as dist

    actor = ActorRolloutRefWorker(case_config(case), "actor")
    actor.init_model()
    mine = dp_share(make_tensors(), actor.layout)
    before = full_weights(actor.actor_engine)  # a collective: before anything fails
    lr_before = actor.actor_engine.get_lr() if actor.actor_engine is not None else None
    # weakly: a reference to the engine would keep its process groups (and their
    # connections) alive through the teardown
    engine = weakref.ref(actor.actor_engine) if actor.actor_engine is not None else None
    batch = failing_batch(case, mine) if rank == FAILING else mine
    error: BaseException | None = None
    start = time.monotonic()
    try:
        actor.update_actor(proto(batch, temperature=1.0))
    except Exception as exc:
        error = exc
    elapsed = time.monotonic() - start
    result: dict[str, Any] = {"outcome": outcome(error), "elapsed": elapsed}
    del error
    # the next call rebuilds the groups and the engine, with the weights it had
    start = time.monotonic()
    try:
        log_prob = col(actor.compute_log_prob(proto(mine)), "old_log_probs")
        rebuilt = actor.actor_engine
        kept = full_weights(rebuilt)
        result["kept_weights"] = sorted(kept) == sorted(before) and all(
            torch.equal(kept[name], value) for name, value in before.items()
        )
        result["rebuilt_engine"] = engine is not None and engine() is None and rebuilt is not None
        result["lr_kept"] = rebuilt is not None and rebuilt.get_lr() == lr_before
        metrics = actor.update_actor(proto(mine, temperature=1.0)).meta_info["metrics"]
        result["after"] = {"kind": "ok", "finite": bool(torch.isfinite(log_prob).all())}
        result["after_metrics"] = dict(metrics)
    except Exception as exc:
        result["after"] = outcome(exc)
    result["after_elapsed"] = time.monotonic() - start
    torch.save(result, out / f"rank{rank}.tmp")
    (out / f"rank{rank}.tmp").rename(out / f"rank{rank}.pt")
    if dist.is_initialized():
        dist.destroy_process_group()
