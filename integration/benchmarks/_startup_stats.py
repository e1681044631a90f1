"""What each start-up benchmark worker reports about its own process (no heavy imports).

A worker module records ``time.perf_counter()`` before its imports and calls
:func:`imported` after them; :func:`process_stats` is what its one call answers.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["imported", "process_stats"]

_import_s: dict[str, float] = {}


def imported(module: str, started: float) -> None:
    """Record how long ``module``'s imports took (wall seconds since ``started``)."""
    _import_s[module] = time.perf_counter() - started


def process_stats() -> dict[str, float]:
    """CPU seconds this process used so far (the Ray worker's own start included), the wall
    time of its worker module's imports, and whether ``torch._dynamo`` is loaded."""
    return {
        "pid": float(os.getpid()),
        "cpu_s": time.process_time(),
        "import_s": sum(_import_s.values()),
        "dynamo_loaded": float("torch._dynamo" in sys.modules),
    }
