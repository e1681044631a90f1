"""Start-up benchmark, baseline (a): a bare Ray actor whose module imports torch."""

from __future__ import annotations

import time

_STARTED = time.perf_counter()

import torch  # noqa: E402
from _startup_stats import imported, process_stats  # noqa: E402

imported(__name__, _STARTED)


class TorchActor:
    """Answers one call; the import of torch is the whole of its start-up."""

    def __init__(self) -> None:
        self.version = torch.__version__

    def ping(self) -> dict[str, float]:
        return process_stats()
