"""``Tracking``: one step's metrics to every tracker of a run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from .._errors import TrainerStateError
from ._protocol import Tracker

__all__ = ["Tracking"]

logger = logging.getLogger(__name__)


class Tracking:
    """The trackers of a run, by name, behind one :class:`Tracker`.

    ``log`` gives the step to every tracker, in order. A tracker that raises does not stop
    the others from recording that step, but its error is not swallowed: it is logged with
    the tracker's name, and once all have been called the first error is raised again, so
    the run stops there (a dashboard that silently stops receiving a run's metrics would be
    found out only after the run). ``close`` closes every tracker, even after one fails to
    close, then raises the first failure; a second ``close`` does nothing, and ``log`` after
    ``close`` raises :class:`TrainerStateError`. A ``Tracking`` is a context manager that
    closes on exit.
    """

    def __init__(self, trackers: Mapping[str, Tracker]) -> None:
        self._trackers = dict(trackers)
        self._closed = False

    @property
    def names(self) -> tuple[str, ...]:
        """The trackers' names, in the order they are called."""
        return tuple(self._trackers)

    @property
    def trackers(self) -> Mapping[str, Tracker]:
        """The trackers, by name (a copy)."""
        return dict(self._trackers)

    @property
    def closed(self) -> bool:
        return self._closed

    def _each(self, action: str, call: Callable[[Tracker], None]) -> None:
        """``call(tracker)`` for every tracker; then the first error raised again."""
        first: Exception | None = None
        for name, tracker in self._trackers.items():
            try:
                call(tracker)
            except Exception as err:
                logger.error("tracker %r failed to %s: %r", name, action, err, exc_info=True)
                if first is None:
                    first = err
        if first is not None:
            raise first

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Give step ``step``'s ``metrics`` to every tracker."""
        if self._closed:
            raise TrainerStateError(f"Tracking.log(step={step}) after close")
        self._each(f"log step {step}", lambda tracker: tracker.log(metrics, step))

    def close(self) -> None:
        """Close every tracker (once)."""
        if self._closed:
            return
        self._closed = True
        self._each("close", lambda tracker: tracker.close())

    def __enter__(self) -> Tracking:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Tracking({list(self._trackers)})"
