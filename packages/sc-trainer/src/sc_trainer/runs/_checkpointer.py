"""The trainer's checkpoints: saved by the workers (per rank) and the driver (its state and
the metrics so far), completed once every worker's part is written, and loaded back.

A checkpoint folder is ``<output>/checkpoints/global_step_<N>/``: ``actor/`` (and
``critic/``) written by the workers, then ``trainer_state.json`` and ``metrics.jsonl`` by
the driver, last, so a folder without the trainer state is incomplete. With background
checkpoints the workers copy their state and return, and write it while training goes on;
the checkpoint is completed when :meth:`Checkpointer.finish` finds them done, at the end of
a later step or of the run. Until then a recovery or a resume does not see it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sc_core import WorkerGroup
from sc_workers import ActorRolloutRefWorker, CriticWorker

from ..config import TrainerConfig
from ._export import HF_FOLDER
from ._output import PendingSave, RunOutput, check_resumable, read_metrics

__all__ = ["Checkpointer"]

logger = logging.getLogger(__name__)

#: ``phase(step, name)``: the context the workers' part of a save runs in (an injected
#: driver fault may fire there: ``driver@step=N:save_checkpoint``)
Phase = Callable[[int, str], contextlib.AbstractContextManager[None]]


class Checkpointer:
    """Saves, completes and loads a run's checkpoints in ``output``: the ``actor`` group's
    state, the ``critic`` group's (PPO), and the trainer's. ``background``: the workers
    write while training goes on; ``keep``: complete checkpoints kept (the newest)."""

    def __init__(
        self,
        output: RunOutput,
        actor: WorkerGroup[ActorRolloutRefWorker],
        critic: WorkerGroup[CriticWorker] | None,
        *,
        background: bool,
        keep: int,
        phase: Phase | None = None,
        save_hf: bool = False,
    ) -> None:
        self.output = output
        self.actor = actor
        self.critic = critic
        self.background = background
        self.keep = keep
        self._phase = phase
        #: also write the actor as a Hugging Face folder (``huggingface/``) into each one
        self.save_hf = save_hf
        #: the checkpoint whose workers may still be writing (see :meth:`save`)
        self.pending: PendingSave | None = None

    @property
    def roles(self) -> list[str]:
        """The folders of a checkpoint the workers write, one per role."""
        return ["actor"] if self.critic is None else ["actor", "critic"]

    def save(
        self, step: int, state: Mapping[str, Any], history: Sequence[Mapping[str, Any]]
    ) -> Path:
        """Worker state (per rank), the trainer's ``state`` and the metrics ``history`` of
        step ``step``, in ``checkpoint_dir(step)``; returns that folder. Complete on return
        unless ``background``."""
        self.finish(block=True)  # one save at a time
        phase = (
            contextlib.nullcontext()
            if self._phase is None
            else self._phase(step, "save_checkpoint")
        )
        with phase:  # the workers' part of the save
            folder = self.output.checkpoint_dir(step)
            folder.mkdir(parents=True, exist_ok=True)
            background = self.background
            self.actor.save_checkpoint(
                str(folder / "actor"), global_step=step, background=background
            )
            if self.critic is not None:
                self.critic.save_checkpoint(
                    str(folder / "critic"), global_step=step, background=background
                )
            if self.save_hf:  # the weights of this step, gathered and written by rank 0
                self.actor.export_hf_model(str(folder / HF_FOLDER))
        self.pending = PendingSave(step, dict(state), [dict(r) for r in history])
        if not background:
            self.finish(block=True)
        return folder

    def finish(self, block: bool) -> Path | None:
        """Complete the pending checkpoint if its workers are done writing (``block``: wait
        for them); then keep only the newest ``keep``. Returns the completed folder, or
        ``None`` when none was completed."""
        pending = self.pending
        if pending is None:
            return None
        timeout = None if block else 0.0
        # every group is asked (each rank answers whether its part is written)
        done = self.actor.wait_checkpoint(timeout=timeout)
        if self.critic is not None:
            done = done + self.critic.wait_checkpoint(timeout=timeout)
        if not all(done):
            return None
        self.pending = None
        return self.output.complete_save(pending, self.keep)

    def settle(self) -> None:
        """In a recovery, where the workers may be gone: complete the pending checkpoint if
        every role published it on disk, else abandon it (:meth:`RunOutput.settle_save`)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            self.output.settle_save(pending, self.roles, self.keep)

    def adopt(
        self, step: int, state: Mapping[str, Any], history: Sequence[Mapping[str, Any]]
    ) -> None:
        """Take over the checkpoint of ``step`` a previous driver left pending (a detached
        run's re-attach): its workers may still be writing it."""
        self.pending = PendingSave(step, dict(state), [dict(r) for r in history])

    def load(self, folder: Path, config: TrainerConfig) -> tuple[int, list[dict[str, Any]]]:
        """Restore every role from the checkpoint in ``folder`` (which ``config`` must be
        able to resume from); returns its step and the metrics up to it."""
        step = check_resumable(folder, config)
        self.actor.load_checkpoint(str(folder / "actor"))
        if self.critic is not None:
            self.critic.load_checkpoint(str(folder / "critic"))
        history = [r for r in read_metrics(folder / "metrics.jsonl") if r["step"] <= step]
        logger.info("resumed from %s at step %d", folder, step)
        return step, history
