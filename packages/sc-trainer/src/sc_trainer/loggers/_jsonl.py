"""The jsonl tracker: what the trackers received, one JSON object a step, in a file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._values import STEP_KEY, scalar_metrics

__all__ = ["JSONL_FILE", "JsonlTracker"]

#: The file the jsonl tracker writes in the output folder (``metrics.jsonl`` is the run's own
#: record, which the run always writes; this tracker leaves it alone).
JSONL_FILE = "tracking.jsonl"


class JsonlTracker:
    """Appends ``{"step": N, <metric>: <number>, ...}`` per step to ``<output_dir>/tracking.jsonl``:
    the numbers the other trackers record (:func:`~._values.scalar_metrics`), keys sorted,
    each line flushed. A run that resumes in the same folder appends to the file."""

    def __init__(self, output_dir: Path) -> None:
        output_dir.mkdir(parents=True, exist_ok=True)
        self.path = output_dir / JSONL_FILE
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        record: dict[str, Any] = {STEP_KEY: step, **scalar_metrics(metrics)}
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
