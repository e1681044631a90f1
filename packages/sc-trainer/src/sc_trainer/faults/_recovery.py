"""Recovery in place: a worker died, its group gets new processes (or its spares), and the
run goes back to its newest complete checkpoint.

A worker that dies during a step surfaces on the driver as a ``WorkerDiedError`` (or as a
``WeightSyncError`` when it died in a weight sync). The trainer then asks its
:class:`Recovery` to bring the workers back, which

1. checks the run may recover (at most ``max_recoveries`` times; a worker that *raised*
   rather than died is not recovered from: its error ends the run);
2. lets the trainer prepare (``prepare``: forget prefetched batches, settle the checkpoint
   being written, find the newest complete one, which ``fit`` always took before its first
   step);
3. replaces the dead ranks of every worker group, the groups in parallel
   (:func:`replace_dead`: ``WorkerGroup.replace_ranks``, new processes on the same
   placement, the group's collective state re-formed);
4. lets the trainer restore (``restore``): the models built again in every re-formed
   group (``init_model`` is idempotent), every role loaded from that checkpoint (weights,
   optimizer, counters, the sampler's and the global RNG states), the step count and
   metrics up to it, and the rollout brought to those weights. The data of a step is a
   function of the seed and the step, so the run replays the lost steps exactly as a
   resume from that checkpoint would.

Each recovery is logged, recorded in the next step's metrics (``recovery/*``) and drawn as
one span in the call trace. The faults that test it are injected by ``_workers.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sc_core import WorkerError, WorkerGroup, driver_span

from .._errors import TrainerRecoveryError
from .._settings import LOST_PEER_GRACE

__all__ = ["LOST_PEER_MARKS", "Recovery", "lost_peer", "replace_dead", "wait_for_dead"]

logger = logging.getLogger(__name__)


def replace_dead(groups: Sequence[WorkerGroup[Any]]) -> dict[str, list[int]]:
    """Replace the dead ranks of every group, the groups at the same time (each waits for
    its new workers' start-up); returns the ranks replaced per group."""
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        done = list(pool.map(lambda group: group.replace_ranks(), groups))
    return {g.name_prefix: ranks for g, ranks in zip(groups, done, strict=True) if ranks}


#: How long a recovery asks whether a worker is dead after an error that does not say a
#: connection to a peer was lost: the cluster marks a killed process dead a moment after
#: its peers noticed.
DEATH_GRACE_S = 5.0

#: What a collective's error says when the connection to a peer process broke (gloo's TCP
#: transport, NCCL): the peer's process, or its whole node, may be gone, and the cluster
#: may take far longer to say so than for a process that died on a live node.
LOST_PEER_MARKS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "gloo/transport",
    "remote process exited",
    "ncclRemoteError",
)


def lost_peer(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from, or a worker's exception it
    carries) says a collective lost its connection to a peer (:data:`LOST_PEER_MARKS`)."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if any(mark in str(exc) for mark in LOST_PEER_MARKS):
            return True
        todo += [exc.__cause__, exc.__context__]
        if isinstance(exc, WorkerError):
            todo.append(exc.cause)
    return False


def wait_for_dead(groups: Sequence[WorkerGroup[Any]], grace_s: float = 5.0) -> bool:
    """Whether a worker of ``groups`` is dead, asking for up to ``grace_s`` seconds (the
    default is :data:`DEATH_GRACE_S`; a rank whose collective failed because its peer died
    may report before the cluster has marked the peer dead; a peer on a lost node is marked
    dead only once the cluster's health checks of that node have failed)."""
    deadline = time.monotonic() + grace_s
    while True:
        for group in groups:
            group.check_worker_aliveness()
        if any(group.dead_ranks for group in groups):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


class Recovery:
    """The recoveries in place of one run: how many it made (:attr:`count`, restored by a
    re-attaching driver) and how many it may (``max_recoveries``)."""

    def __init__(
        self, max_recoveries: int, count: int = 0, *, lost_peer_grace_s: float | None = None
    ) -> None:
        self.max_recoveries = max_recoveries
        #: worker deaths this run recovered from
        self.count = count
        #: how long to wait for the cluster to report a death after an error that says a
        #: collective lost its peer (:func:`lost_peer`); default
        #: ``$SC_TRAINER_LOST_PEER_GRACE_S`` or 60 s
        self.lost_peer_grace_s = (
            LOST_PEER_GRACE.get() if lost_peer_grace_s is None else lost_peer_grace_s
        )

    def recover(
        self,
        step: int,
        error: BaseException | None,
        groups: Sequence[WorkerGroup[Any]],
        prepare: Callable[[str], Path],
        restore: Callable[[Path], int],
    ) -> dict[str, Any]:
        """Bring ``groups`` back after ``error`` (a death during ``step``); returns the
        ``recovery/*`` metrics.

        ``prepare(what)`` runs before any process is replaced and returns the checkpoint to
        restore (``what`` says what happened, for its errors); ``restore(checkpoint)`` runs
        once the groups are whole again and returns the step the run is back at. Raises
        :class:`TrainerRecoveryError` (from ``error``) when the run may not recover, and
        ``error`` itself when no worker died. ``error=None``: a re-attached driver found a
        worker dead (it died while no driver was attached), or its predecessor died
        recovering; it recovers anyway.
        """
        done, limit = self.count, self.max_recoveries
        what = "a worker died while no driver was attached" if error is None else str(error)
        if done >= limit:
            raise TrainerRecoveryError(
                f"step {step}: {what}; the run already recovered {done} times "
                f"(max_recoveries={limit})"
            ) from error
        started = time.perf_counter()
        with driver_span("trainer", "recovery"):
            if error is not None and not wait_for_dead(groups, self._grace(step, error)):
                raise error  # every worker is alive: not a death, nothing to recover from
            checkpoint = prepare(what)
            try:
                replaced = replace_dead(groups)
            except Exception as exc:  # no new workers (no room for them, a constructor failed)
                raise TrainerRecoveryError(
                    f"step {step}: {what.splitlines()[0]}; the dead workers could not be "
                    f"replaced: {type(exc).__name__}: {exc}"
                ) from exc
            back_at = restore(checkpoint)
        seconds = time.perf_counter() - started
        self.count = done + 1
        logger.warning(
            "step %d: %s; replaced %s and restored %s in %.1f s (recovery %d of at most %d)",
            step,
            what,
            replaced,
            checkpoint.name,
            seconds,
            done + 1,
            limit,
        )
        return {
            "recovery/count": done + 1,
            "recovery/seconds": seconds,
            "recovery/from_step": back_at,
            "recovery/failed_step": step,
        }

    def _grace(self, step: int, error: BaseException) -> float:
        """How long to ask whether a worker died after ``error``: longer when it says a
        collective lost its peer (a lost node is declared dead by health checks)."""
        if not lost_peer(error):
            return DEATH_GRACE_S
        logger.warning(
            "step %d: a collective lost its connection to a peer; waiting up to %.0f s for the "
            "cluster to report which worker died",
            step,
            self.lost_peer_grace_s,
        )
        return self.lost_peer_grace_s
