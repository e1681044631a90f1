"""Recovering a run in place when a worker dies, and the fault injection that tests it.

A worker that dies during a step surfaces on the driver as a ``WorkerDiedError`` (or as a
``WeightSyncError`` when it died in a weight sync). :func:`recover` then

1. replaces the dead ranks of every worker group, the groups in parallel
   (``WorkerGroup.replace_ranks``: new processes on the same placement, the group's
   collective state re-formed);
2. builds the models again in every re-formed group (``init_model`` on every role: it is
   idempotent, so the roles of groups that were not re-formed keep their models);
3. restores every role, the re-formed ones and the others alike, from the newest complete
   checkpoint: weights, optimizer, the update counter, the sampler's and the global RNG
   states, the step count and the metrics up to it; the data of a step is a function of the
   seed and the step, so the run replays the lost steps exactly as a resume from that
   checkpoint would. ``fit`` saves a checkpoint before its first step, so there always is
   one;
4. re-opens the weight-sync channel of a separately placed rollout and syncs it.

The number of recoveries of one run is bounded (``TrainerConfig.max_recoveries``); each is
logged, recorded in the next step's metrics (``recovery/*``) and drawn as one span in the
trace. A worker that *raised* is not recovered from: its error ends the run.

:class:`FaultSpec` (``TrainerConfig.inject_fault``, ``sc-demo --inject-fault
actor:1@step=30``) kills one rank of one role when a step begins, or arms a fault that kills
the rank (or makes it raise) inside a named method (``actor:1@step=3:update_actor+0.2``);
each fault fires once. Several faults are separated by commas.
"""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sc_core import FAULT_ACTIONS, FaultAction, WorkerGroup, driver_span

from ._errors import TrainerConfigError, TrainerRecoveryError, TrainerStateError

if TYPE_CHECKING:
    from ._roles import TrainerGroups
    from ._trainer import RayPPOTrainer

__all__ = ["FAULT_ROLES", "FaultSpec", "inject", "inject_due", "recover"]

logger = logging.getLogger(__name__)

#: The roles a fault can be injected into.
FAULT_ROLES = ("actor", "critic", "rollout")

_SPEC = re.compile(
    r"^(?P<role>[a-z]+):(?P<rank>\d+)@step=(?P<step>\d+)"
    r"(?::(?P<method>[A-Za-z_]\w*)(?:\+(?P<delay>\d+(?:\.\d*)?|\.\d+))?)?"
    r"(?::(?P<action>kill|raise))?$"
)
_GRAMMAR = "role:rank@step=N[:method[+seconds]][:kill|raise], e.g. 'actor:1@step=30'"


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault: rank ``rank`` of role ``role``'s group, at step ``step``, once.

    Without ``method`` the driver kills the rank as the step begins. With ``method`` the
    fault is armed on the rank as the step begins (``WorkerGroup.inject_fault``) and fires
    when the rank next starts that method: the process exits ``delay_s`` seconds into it
    (``"kill"``: inside the computation, a collective, or a background checkpoint write), or
    the method raises (``"raise"``: an error, which the trainer does not recover from).
    """

    role: str
    rank: int
    step: int
    method: str | None = None
    delay_s: float = 0.0
    action: FaultAction = "kill"

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
        if self.action not in FAULT_ACTIONS:
            raise TrainerConfigError(
                f"inject_fault: the action must be one of {FAULT_ACTIONS}, got {self.action!r}"
            )
        if self.method is None and (self.delay_s or self.action != "kill"):
            raise TrainerConfigError(
                f"inject_fault: a delay or 'raise' needs a method ({_GRAMMAR})"
            )
        if self.action == "raise" and self.delay_s:
            raise TrainerConfigError(
                f"inject_fault: a raised fault fires as {self.method} starts; drop the delay "
                f"(+{self.delay_s:g})"
            )

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """``"role:rank@step=N[:method[+seconds]][:kill|raise]"``, e.g. ``"actor:1@step=30"``
        or ``"critic:0@step=3:update_critic+0.2"``."""
        match = _SPEC.match(text.strip()) if isinstance(text, str) else None
        if match is None or match["method"] in FAULT_ACTIONS:  # "actor:1@step=2:raise"
            raise TrainerConfigError(f"inject_fault must look like {_GRAMMAR}, got {text!r}")
        action = cast(FaultAction, match["action"] or "kill")
        return cls(
            match["role"],
            int(match["rank"]),
            int(match["step"]),
            match["method"],
            float(match["delay"] or 0.0),
            action,
        )

    @classmethod
    def parse_all(cls, text: str) -> tuple[FaultSpec, ...]:
        """Several faults, separated by commas."""
        if not isinstance(text, str) or not text.strip():
            raise TrainerConfigError(f"inject_fault must look like {_GRAMMAR}, got {text!r}")
        return tuple(cls.parse(part) for part in text.split(","))

    def __str__(self) -> str:
        where = f"{self.role}:{self.rank}@step={self.step}"
        if self.method is None:
            return where
        delay = f"+{self.delay_s:g}" if self.delay_s else ""
        return f"{where}:{self.method}{delay}:{self.action}"


def inject(group: WorkerGroup[Any], fault: FaultSpec) -> None:
    """Inject ``fault`` into ``group`` (the group of ``fault.role``) as its step begins."""
    if not 0 <= fault.rank < group.world_size:
        raise TrainerConfigError(
            f"inject_fault: rank {fault.rank} is outside the group's {group.world_size} workers"
        )
    if fault.method is not None:
        group.inject_fault(fault.rank, fault.method, action=fault.action, delay_s=fault.delay_s)
        return
    kill_worker = getattr(group, "kill_worker", None)
    if callable(kill_worker):  # LocalWorkerGroup
        kill_worker(fault.rank)
        return
    import ray

    ray.kill(group.workers[fault.rank], no_restart=True)


def inject_due(groups: TrainerGroups, faults: list[FaultSpec], step: int) -> list[FaultSpec]:
    """Inject the faults of ``faults`` whose step begins into their roles' groups; the faults
    left for later steps."""
    for fault in (f for f in faults if f.step == step):
        group = {
            "actor": groups.actor_rollout,
            "critic": groups.critic,
            "rollout": groups.rollout,
        }[fault.role]
        if group is None:
            raise TrainerStateError(f"inject_fault: this run has no {fault.role} group")
        logger.warning("step %d: injecting the fault %s", step, fault)
        inject(group, fault)
    return [f for f in faults if f.step != step]


def recover(trainer: RayPPOTrainer, step: int, error: BaseException) -> dict[str, Any]:
    """Bring ``trainer``'s workers back after ``error`` (a death during ``step``) and restore
    the newest complete checkpoint (``fit`` saved one before its first step); returns the
    ``recovery/*`` metrics. Raises :class:`TrainerRecoveryError` (from ``error``) when the run
    may not recover (``max_recoveries`` reached, or no checkpoint left), and ``error`` itself
    when no worker died."""
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
        trainer._settle_pending_save()  # complete on disk, or abandoned
        latest = _latest_checkpoint(trainer.output.checkpoint_root)
        if latest is None:  # fit saves one before the first step; someone removed it
            raise TrainerRecoveryError(
                f"step {step}: a worker died ({error}), and {trainer.output.checkpoint_root} "
                "holds no complete checkpoint to recover from"
            ) from error
        replaced = _replace_dead(groups.owned)
        trainer._init_models()  # builds what the re-formed groups dropped; the rest keep theirs
        trainer._load_checkpoint(latest)
        trainer._resync_rollout()
    seconds = time.perf_counter() - started
    trainer.recoveries = done + 1
    logger.warning(
        "step %d: %s; replaced %s and restored %s in %.1f s (recovery %d of at most %d)",
        step,
        error,
        replaced,
        latest.name,
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


def _replace_dead(groups: tuple[WorkerGroup[Any], ...]) -> dict[str, list[int]]:
    """Replace the dead ranks of every group, the groups at the same time (each waits for
    its new workers' start-up); returns the ranks replaced per group."""
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        done = list(pool.map(lambda group: group.replace_ranks(), groups))
    return {g.name_prefix: ranks for g, ranks in zip(groups, done, strict=True) if ranks}


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
