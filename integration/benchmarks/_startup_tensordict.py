"""Start-up benchmark, baseline (b): a bare Ray actor whose module imports torch and
tensordict, plainly (tensordict imports ``torch._dynamo`` with it)."""

from __future__ import annotations

import time

_STARTED = time.perf_counter()

import tensordict  # noqa: E402
import torch  # noqa: E402
from _startup_stats import imported, process_stats  # noqa: E402

imported(__name__, _STARTED)


class TensordictActor:
    """Answers one call; importing torch and tensordict is the whole of its start-up."""

    def __init__(self) -> None:
        self.versions = (torch.__version__, tensordict.__version__)

    def ping(self) -> dict[str, float]:
        return process_stats()
