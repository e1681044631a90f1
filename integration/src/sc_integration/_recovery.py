"""Recovering a run in place when a worker dies, and the fault injection that tests it.

A worker that dies during a step surfaces on the driver as a ``WorkerDiedError`` (or as a
``WeightSyncError`` when it died in a weight sync). :func:`recover` then

1. replaces the dead ranks of every worker group (``WorkerGroup.replace_ranks``: new
   processes on the same placement, the group's collective state re-formed);
2. builds the models again in every re-formed group (``init_model`` on every role: it is
   idempotent, so the roles of groups that were not re-formed keep their models);
3. restores every role, the re-formed ones and the others alike, from the newest complete
   checkpoint: weights, optimizer, the update counter, the sampler's and the global RNG
   states, the step count and the metrics up to it; the data of a step is a function of the
   seed and the step, so the run replays the lost steps exactly as a resume from that
   checkpoint would. Before the first checkpoint, every worker of every group is replaced
   instead and the run starts again from step 0, as a new run with the same seed would;
4. re-opens the weight-sync channel of a separately placed rollout and syncs it.

The number of recoveries of one run is bounded (``TrainerConfig.max_recoveries``); each is
logged, recorded in the next step's metrics (``recovery/*``) and drawn as one span in the
trace. :class:`FaultSpec` (``TrainerConfig.inject_fault``, ``sc-demo --inject-fault
actor:1@step=30``) kills one rank of one role when a step begins, once.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sc_core import WorkerGroup, driver_span

from ._errors import TrainerConfigError, TrainerRecoveryError

if TYPE_CHECKING:
    from ._trainer import RayPPOTrainer

__all__ = ["FAULT_ROLES", "FaultSpec", "kill_rank", "recover"]

logger = logging.getLogger(__name__)

#: The roles a fault can be injected into.
FAULT_ROLES = ("actor", "critic", "rollout")

_SPEC = re.compile(r"^(?P<role>[a-z]+):(?P<rank>\d+)@step=(?P<step>\d+)$")


@dataclass(frozen=True)
class FaultSpec:
    """Kill rank ``rank`` of role ``role``'s group when step ``step`` begins (once)."""

    role: str
    rank: int
    step: int

    def __post_init__(self) -> None:
        if self.role not in FAULT_ROLES:
            raise TrainerConfigError(
                f"inject_fault: role must be one of {FAULT_ROLES}, got {self.role!r}"
            )
        if self.rank < 0 or self.step < 1:
            raise TrainerConfigError(
                f"inject_fault: rank must be >= 0 and step >= 1, got rank {self.rank}, "
                f"step {self.step}"
            )

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """``"role:rank@step=N"``, e.g. ``"actor:1@step=30"``."""
        match = _SPEC.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise TrainerConfigError(
                f"inject_fault must look like 'actor:1@step=30' (role:rank@step=N), got {text!r}"
            )
        return cls(match["role"], int(match["rank"]), int(match["step"]))


def kill_rank(group: WorkerGroup[Any], rank: int) -> None:
    """Kill the worker process of ``rank`` (the in-process backend simulates it)."""
    if not 0 <= rank < group.world_size:
        raise TrainerConfigError(
            f"inject_fault: rank {rank} is outside the group's {group.world_size} workers"
        )
    kill_worker = getattr(group, "kill_worker", None)
    if callable(kill_worker):  # LocalWorkerGroup
        kill_worker(rank)
        return
    import ray

    ray.kill(group.workers[rank], no_restart=True)


def recover(trainer: RayPPOTrainer, step: int, error: BaseException) -> dict[str, Any]:
    """Bring ``trainer``'s workers back after ``error`` (a death during ``step``) and restore
    the newest checkpoint (or start again from step 0 before the first one); returns the
    ``recovery/*`` metrics. Raises :class:`TrainerRecoveryError` (from ``error``) when the run
    may not recover (``max_recoveries`` reached), and ``error`` itself when no worker died."""
    cfg = trainer.config
    done = trainer.recoveries
    if done >= cfg.max_recoveries:
        raise TrainerRecoveryError(
            f"step {step}: a worker died ({error}); the run already recovered {done} times "
            f"(max_recoveries={cfg.max_recoveries})"
        ) from error
    started = time.perf_counter()
    with driver_span("trainer", "recovery"):
        groups = trainer._workers("recover")
        if not _wait_for_dead(groups.owned):
            raise error  # every worker is alive: not a death, nothing to recover from
        latest = _latest_checkpoint(trainer.output.checkpoint_root)
        replaced: dict[str, list[int]] = {}
        for group in groups.owned:
            # nothing saved yet: every worker starts afresh, and the run from step 0
            ranks = group.replace_ranks(None if latest else range(group.world_size))
            if ranks:
                replaced[group.name_prefix] = ranks
        trainer._init_models()  # builds what the re-formed groups dropped; the rest keep theirs
        if latest is None:
            trainer._restart()
        else:
            trainer._load_checkpoint(latest)
        trainer._resync_rollout()
    seconds = time.perf_counter() - started
    trainer.recoveries = done + 1
    logger.warning(
        "step %d: %s; replaced %s and restored %s in %.1f s (recovery %d of at most %d)",
        step,
        error,
        replaced,
        "the start" if latest is None else latest.name,
        seconds,
        done + 1,
        cfg.max_recoveries,
    )
    return {
        "recovery/count": done + 1,
        "recovery/seconds": seconds,
        "recovery/from_step": trainer.global_step,
        "recovery/failed_step": step,
    }


def _wait_for_dead(groups: tuple[WorkerGroup[Any], ...], grace_s: float = 5.0) -> bool:
    """Whether a worker of ``groups`` is dead, asking for up to ``grace_s`` seconds (a rank
    whose collective failed because its peer died may report before the cluster has marked
    the peer dead)."""
    deadline = time.monotonic() + grace_s
    while True:
        for group in groups:
            group.check_worker_aliveness()
        if any(group.dead_ranks for group in groups):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _latest_checkpoint(root: Path) -> Path | None:
    from ._output import resolve_checkpoint

    try:
        return resolve_checkpoint(root)
    except FileNotFoundError:
        return None
