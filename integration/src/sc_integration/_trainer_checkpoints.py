"""The trainer's checkpoints: saved by the workers (per rank) and the driver (its state and
the metrics so far), completed once every worker's part is written, and loaded back."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

from ._output import PendingSave, check_resumable, read_metrics
from ._trainer_core import TrainerCore

__all__ = ["TrainerCheckpoints"]

logger = logging.getLogger(__name__)


class TrainerCheckpoints(TrainerCore):
    """Saving, completing and loading checkpoints (a part of ``RayPPOTrainer``)."""

    def save_checkpoint(self) -> Path:
        """Worker state (per rank), trainer state and the metrics so far, in
        ``checkpoint_dir(global_step)``; returns that folder.

        With ``config.background_checkpoints`` the workers copy their state and return, and
        write it while training goes on; the checkpoint becomes complete (trainer state,
        ``latest``) when :meth:`_finish_save` finds them done, at the end of a later step or
        of :meth:`fit`. Before that a recovery or a resume does not see it."""
        self._finish_save(block=True)  # one save at a time
        step = self.global_step
        with self._driver_phase(step, "save_checkpoint"):  # the workers' part of the save
            folder = self.output.checkpoint_dir(step)
            folder.mkdir(parents=True, exist_ok=True)
            background = self.config.background_checkpoints
            self.actor_rollout_wg.save_checkpoint(
                str(folder / "actor"), global_step=step, background=background
            )
            if self.use_critic:
                self.critic_wg.save_checkpoint(
                    str(folder / "critic"), global_step=step, background=background
                )
        state = {"global_step": step, "config": asdict(self.config)}
        self._pending_save = PendingSave(step, state, list(self.history))
        if not background:
            self._finish_save(block=True)
        return folder

    def _finish_save(self, block: bool) -> Path | None:
        """Complete the pending checkpoint if its workers are done writing (``block``: wait
        for them); then keep only the newest ``config.keep_checkpoints``. Returns the
        completed folder, or ``None`` when none was completed."""
        pending = self._pending_save
        if pending is None:
            return None
        timeout = None if block else 0.0
        # every group is asked (each rank answers whether its part is written)
        done = self.actor_rollout_wg.wait_checkpoint(timeout=timeout)
        if self.use_critic:
            done = done + self.critic_wg.wait_checkpoint(timeout=timeout)
        if not all(done):
            return None
        self._pending_save = None
        return self._complete_save(pending)

    def _complete_save(self, pending: PendingSave) -> Path:
        return self.output.complete_save(pending, self.config.keep_checkpoints)

    def _settle_pending_save(self) -> None:
        """In a recovery: complete the pending checkpoint if every role published it on
        disk, else abandon it (:meth:`RunOutput.settle_save`)."""
        pending, self._pending_save = self._pending_save, None
        if pending is not None:
            roles = ["actor", "critic"] if self.use_critic else ["actor"]
            self.output.settle_save(pending, roles, self.config.keep_checkpoints)

    def _load_checkpoint(self, folder: Path) -> None:
        step = check_resumable(folder, self.config)
        self.actor_rollout_wg.load_checkpoint(str(folder / "actor"))
        if self.use_critic:
            self.critic_wg.load_checkpoint(str(folder / "critic"))
        self.global_step = step
        self.history = [r for r in read_metrics(folder / "metrics.jsonl") if r["step"] <= step]
        self.output.start(self.history)
        logger.info("resumed from %s at step %d", folder, step)
