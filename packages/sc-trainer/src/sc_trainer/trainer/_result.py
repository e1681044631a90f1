"""What a run reports when it ends, and what it reports after each step."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..runs import RunOutput

__all__ = ["MetricsSink", "ProgressFn", "RunResult"]

#: ``progress(step, metrics)``: called after every step (and after a recovery)
ProgressFn = Callable[[int, Mapping[str, Any]], None]


class MetricsSink(Protocol):
    """Where the trainer gives each record of ``metrics.jsonl`` too (the experiment trackers
    of :mod:`sc_trainer.loggers`)."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None: ...


@dataclass
class RunResult:
    """What a finished run reports."""

    output: RunOutput
    final_step: int
    first_val_reward: float
    last_val_reward: float
    checkpoint: Path
    seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)
    #: seconds from the start of :meth:`TaskRunner.run` to the first step: cluster, workers
    #: (started, or re-attached to), models, restore
    startup_seconds: float = 0.0
