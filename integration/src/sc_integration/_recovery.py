"""Recovering a run in place when a worker dies: what the trainer does to its worker groups.

A worker that dies during a step surfaces on the driver as a ``WorkerDiedError`` (or as a
``WeightSyncError`` when it died in a weight sync). The trainer's recovery
(``RayPPOTrainer._recover``) then

1. replaces the dead ranks of every worker group, the groups in parallel
   (:func:`replace_dead`: ``WorkerGroup.replace_ranks``, new processes on the same
   placement, the group's collective state re-formed);
2. builds the models again in every re-formed group (``init_model`` on every role: it is
   idempotent, so the roles of groups that were not re-formed keep their models);
3. restores every role, the re-formed ones and the others alike, from the newest complete
   checkpoint (:func:`latest_checkpoint`): weights, optimizer, the update counter, the
   sampler's and the global RNG states, the step count and the metrics up to it; the data
   of a step is a function of the seed and the step, so the run replays the lost steps
   exactly as a resume from that checkpoint would. ``fit`` saves a checkpoint before its
   first step, so there always is one;
4. re-opens the weight-sync channel of a separately placed rollout and syncs it.

The number of recoveries of one run is bounded (``TrainerConfig.max_recoveries``); each is
logged, recorded in the next step's metrics (``recovery/*``) and drawn as one span in the
trace. A worker that *raised* is not recovered from: its error ends the run. The faults
that test this are injected by ``_faults.py``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sc_core import WorkerGroup

from ._output import resolve_checkpoint

__all__ = ["latest_checkpoint", "replace_dead", "wait_for_dead"]


def replace_dead(groups: tuple[WorkerGroup[Any], ...]) -> dict[str, list[int]]:
    """Replace the dead ranks of every group, the groups at the same time (each waits for
    its new workers' start-up); returns the ranks replaced per group."""
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        done = list(pool.map(lambda group: group.replace_ranks(), groups))
    return {g.name_prefix: ranks for g, ranks in zip(groups, done, strict=True) if ranks}


def wait_for_dead(groups: tuple[WorkerGroup[Any], ...], grace_s: float = 5.0) -> bool:
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


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or ``None`` when there is none."""
    try:
        return resolve_checkpoint(root)
    except FileNotFoundError:
        return None
