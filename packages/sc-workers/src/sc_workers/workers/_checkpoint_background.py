"""Checkpoints written in the background of training.

``save_checkpoint(..., background=True)`` takes this rank's state (the model shards,
optimizer state, schedule, RNG states) and returns; a thread of the worker process writes it
into the version that rank 0 opened, and rank 0's thread publishes the version once every
rank's file is there. Training goes on meanwhile. On a GPU the state is first copied to CPU
memory (the step pays for that copy, not for the disk); a CPU engine's tensors are written
as they are, without a copy, and the worker's next update waits until this rank's file is
written before it changes them (:meth:`BackgroundSave.wait_written`).

The writer threads use no collective (a collective issued from a second thread would race
the training's own collectives on the same process group): each rank's file appears through
``os.replace``, and rank 0 waits for all of them on the shared filesystem, for at most
``SC_WORKERS_PG_TIMEOUT_S``, as the blocking save waits at its barrier. What is published is
as atomic as a blocking save's (see :mod:`._checkpoint`): a version that never completes
stays a ``.tmp`` directory, which the next save clears.

A worker holds at most one :class:`BackgroundSave`; the next save, a load and
``wait_checkpoint`` wait for it, and a group that re-forms cancels it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import CheckpointError

__all__ = ["BackgroundSave", "wait_for_files"]

logger = logging.getLogger(__name__)

_POLL_S = 0.01


class _SaveCancelled(Exception):
    """A background save stopped because its group re-formed: abandoned, not failed (caught
    on the writer thread, never raised to a caller)."""


def wait_for_files(
    folder: Path, names: set[str], timeout_s: float, cancel: threading.Event, where: str
) -> None:
    """Return once every file of ``names`` is in ``folder``; raise :class:`CheckpointError`
    after ``timeout_s`` seconds, :class:`_SaveCancelled` once ``cancel`` is set."""
    deadline = time.monotonic() + timeout_s
    while True:
        present = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
        if names <= present:
            return
        if cancel.is_set():
            raise _SaveCancelled(where)
        if time.monotonic() >= deadline:
            raise CheckpointError(
                f"{where}: {folder} still lacks {sorted(names - present)} after {timeout_s:g} s "
                "(SC_WORKERS_PG_TIMEOUT_S); did a rank die, or do the ranks not share this "
                "filesystem?"
            )
        cancel.wait(_POLL_S)


class BackgroundSave:
    """One rank's share of a checkpoint being written by a thread.

    ``write(cancel, written)`` runs on the thread and sets ``written`` once this rank's file
    is written; what it raises is kept and raised by :meth:`wait` as a
    :class:`CheckpointError` naming ``where``.
    """

    def __init__(
        self, where: str, step: int, write: Callable[[threading.Event, threading.Event], Any]
    ) -> None:
        self.where = where
        self.step = step
        self._cancel = threading.Event()
        #: set once this rank's file is written (or the write failed): the live tensors it
        #: reads may change after that
        self._written = threading.Event()
        self._error: BaseException | None = None
        self._write = write
        self._thread = threading.Thread(
            target=self._run, name=f"sc-checkpoint-step-{step}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            self._write(self._cancel, self._written)
        except _SaveCancelled:
            logger.info("%s: the background save of step %d was cancelled", self.where, self.step)
        except BaseException as exc:  # kept for wait(), which raises it on the caller's thread
            self._error = exc
        finally:
            self._written.set()

    def wait_written(self) -> None:
        """Return once this rank's file is written (or its write failed): from then on the
        state it wrote may change. Errors are left for :meth:`wait`."""
        self._written.wait()

    def done(self) -> bool:
        """Whether the thread has finished (written, failed or cancelled)."""
        return not self._thread.is_alive()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait up to ``timeout_s`` (``None``: for good) for the write; ``True`` once it is
        finished. Raises :class:`CheckpointError` if it failed."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(
                f"{self.where}: the background save of step {self.step} failed: "
                f"{type(error).__name__}: {error}"
            ) from error
        return True

    def cancel(self) -> None:
        """Stop waiting for the other ranks (the group re-forms); returns at once. What this
        rank already wrote stays in the unpublished ``.tmp`` version."""
        self._cancel.set()
