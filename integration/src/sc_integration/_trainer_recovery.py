"""The trainer's recovery in place: a worker died, the group gets new processes (or its
spares), and the newest complete checkpoint is restored (see ``_recovery.py`` for the group
helpers); and the injected faults that test it (``TrainerConfig.inject_fault``)."""

from __future__ import annotations

import logging
import time
from typing import Any

from sc_core import driver_span

from ._errors import TrainerRecoveryError
from ._faults import inject_due
from ._recovery import latest_checkpoint, replace_dead, wait_for_dead
from ._trainer_checkpoints import TrainerCheckpoints
from ._trainer_detached import TrainerDetached

__all__ = ["TrainerRecovery"]

logger = logging.getLogger(__name__)


class TrainerRecovery(TrainerDetached, TrainerCheckpoints):
    """Recovery in place and fault injection (a part of ``RayPPOTrainer``)."""

    def _inject_fault(self, step: int) -> None:
        """Inject the faults of ``config.inject_fault`` whose step begins (each once)."""
        if any(f.step == step for f in self._faults):
            self._faults = inject_due(self._workers("inject_fault"), self._faults, step)

    def _recover(self, step: int, error: BaseException | None) -> dict[str, Any]:
        """Bring the workers back after ``error`` (a death during ``step``) and restore the
        newest complete checkpoint (``fit`` saved one before its first step; see
        ``_recovery.py``); returns the ``recovery/*`` metrics. Raises
        :class:`TrainerRecoveryError` (from ``error``) when the run may not recover
        (``max_recoveries`` reached, or no checkpoint left), and ``error`` itself when no
        worker died. ``error=None``: a re-attached driver found a worker dead (it died while
        no driver was attached), or its predecessor died recovering; it recovers anyway."""
        done, limit = self.recoveries, self.config.max_recoveries
        what = "a worker died while no driver was attached" if error is None else str(error)
        if done >= limit:
            raise TrainerRecoveryError(
                f"step {step}: {what}; the run already recovered {done} times "
                f"(max_recoveries={limit})"
            ) from error
        started = time.perf_counter()
        with driver_span("trainer", "recovery"):
            groups = self._workers("recover")
            if error is not None and not wait_for_dead(groups.owned):
                raise error  # every worker is alive: not a death, nothing to recover from
            if self._session is not None:  # generations launched before it are not reused
                self._session.forget_launches()
            self._begin_step(step, recovering=True)  # a detached run: redo it if we die
            self._settle_pending_save()  # complete on disk, or abandoned
            latest = latest_checkpoint(self.output.checkpoint_root)
            if latest is None:  # fit saves one before the first step; someone removed it
                raise TrainerRecoveryError(
                    f"step {step}: {what}, and {self.output.checkpoint_root} holds no complete "
                    "checkpoint to recover from"
                ) from error
            replaced = replace_dead(groups.owned)
            self._init_models()  # builds what the re-formed groups dropped; the rest keep theirs
            self._load_checkpoint(latest)
            self._resync_rollout()
        seconds = time.perf_counter() - started
        self.recoveries = done + 1
        logger.warning(
            "step %d: %s; replaced %s and restored %s in %.1f s (recovery %d of at most %d)",
            step,
            what,
            replaced,
            latest.name,
            seconds,
            done + 1,
            limit,
        )
        return {
            "recovery/count": done + 1,
            "recovery/seconds": seconds,
            "recovery/from_step": self.global_step,
            "recovery/failed_step": step,
        }

    def _resync_rollout(self) -> None:
        """After a recovery: a separately placed rollout gets the restored weights over a
        fresh channel."""
        if self._weight_sync is not None:
            self._weight_sync.reset()
            self._sync_weights({}, self.global_step)
