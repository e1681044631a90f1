"""The tracker protocol: what every experiment tracker of a run does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Tracker"]


@runtime_checkable
class Tracker(Protocol):
    """An experiment tracker: receives one training step's metrics at a time.

    ``metrics`` is the step's flat record (``{"train/reward": 0.5, "actor/pg_loss": ...}``);
    a tracker records its numbers (see :func:`~sc_trainer.loggers.make_trackers` for which
    values count) at ``step`` and skips the rest. ``close`` flushes and releases what the
    tracker holds (files, a run of the backend); it is called once, at the end of the run.
    """

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` as the values of training step ``step``."""
        ...

    def close(self) -> None:
        """Flush and release the tracker's resources."""
        ...
