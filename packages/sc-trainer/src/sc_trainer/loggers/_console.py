"""The console tracker: one readable line per step on standard output."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from ._values import scalar_metrics

__all__ = ["CONSOLE_KEYS", "ConsoleTracker", "format_line"]

#: The metrics a console line shows, in this order, when the step has them; a step with none
#: of them shows all its numbers, by name.
CONSOLE_KEYS: tuple[str, ...] = (
    "train/reward",
    "val/reward",
    "actor/pg_loss",
    "actor/entropy",
    "actor/kl_ref",
    "critic/vf_loss",
    "perf/step_time_s",
)


def _rounded(value: float | int) -> str:
    """An integer as it is, a float to 4 significant digits."""
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def format_line(metrics: Mapping[str, Any], step: int, keys: Sequence[str] = CONSOLE_KEYS) -> str:
    """The console line of one step: ``step 3 | train/reward 0.5 | actor/pg_loss -0.0123``."""
    numbers = scalar_metrics(metrics)
    shown = [k for k in keys if k in numbers] or sorted(numbers)
    return " | ".join([f"step {step}", *(f"{k} {_rounded(numbers[k])}" for k in shown)])


class ConsoleTracker:
    """Writes :func:`format_line` for each step to ``stream`` (standard output by default,
    looked up at each step, so a redirected ``sys.stdout`` is followed)."""

    def __init__(self, keys: Sequence[str] = CONSOLE_KEYS, stream: TextIO | None = None) -> None:
        self._keys = tuple(keys)
        self._stream = stream

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        stream = self._stream if self._stream is not None else sys.stdout
        stream.write(format_line(metrics, step, self._keys) + "\n")
        stream.flush()

    def close(self) -> None:
        stream = self._stream if self._stream is not None else sys.stdout
        stream.flush()
