"""What every benchmark records about the machine it ran on (its JSON "machine" entry), how it
writes its result file, and the helpers several of them measure with."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def machine(**extra: Any) -> dict[str, Any]:
    """CPU count, Python, platform and load average now, plus ``extra`` (library versions)."""
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "loadavg_at_start": list(os.getloadavg()),
        **extra,
    }


def stamp(benchmark: str, **extra: Any) -> dict[str, Any]:
    """The entries a result file opens with: what was measured, when (UTC, to the second) and
    on what (``machine(**extra)``)."""
    return {
        "benchmark": benchmark,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(**extra),
    }


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write a benchmark's ``result`` as indented JSON to ``path`` (folders made) and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def write_measurement(
    path: Path,
    benchmark: str,
    result: dict[str, Any],
    *,
    quick: bool,
    leave_out: str = "samples",
    **extra: Any,
) -> None:
    """Print ``result`` (less its ``leave_out`` entry: the raw samples) and write it to
    ``path`` under the :func:`stamp` of ``benchmark`` (``extra`` in its machine entry), with
    whether the run was ``quick``."""
    print({k: v for k, v in result.items() if k != leave_out}, flush=True)
    write_result(path, {**stamp(benchmark, **extra), "quick": quick, "result": result})


@contextlib.contextmanager
def local_ray(num_cpus: int) -> Iterator[None]:
    """A Ray cluster of ``num_cpus`` on this machine for the ``with`` block, shut down after
    it (no dashboard, workers' output kept from the driver; workers run in this environment,
    not in one that ``uv run`` would build)."""
    import ray  # here: the scripts that do not use Ray do not import it

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def median_times(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Median wall time of each function; the functions take turns, in an order reversed
    every other repeat (ABBA), so that neither always runs right after the other."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    forward = list(fns.items())
    for i in range(repeat):
        for name, fn in forward if i % 2 == 0 else forward[::-1]:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}
