"""The tool task's validation curves: ``sc-demo --task tool-calc`` for several seeds.

    uv run python integration/benchmarks/tool_calc_curve.py              # seeds 0 1 2
    uv run python integration/benchmarks/tool_calc_curve.py --from /tmp/tc-0 /tmp/tc-1

Each run is the ``sc-demo`` command in a subprocess (its own Ray cluster), one at a time,
with the task's defaults and ``--seed``; ``--from`` reads runs already made instead (their
output directories, each with its ``config.yaml`` and ``metrics.jsonl``). For each run it
records the validation reward at every validation step (greedy, 256 held-out problems, no
hints), the share of sessions whose policy called, the largest gap between the engine's
log-probs and the actor's (``rollout/log_prob_diff_max``), and whether the run ends at 0.9 or
more and stays there over its last 100 steps (the issue-40 criterion). Writes
``results/tool_calc_curve.json`` and ``docs/img/tool-calc-curve.png``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _curves import plot_curves  # this folder: the scripts' own
from _machine import machine, write_result

ROOT = Path(__file__).resolve().parents[2]
RESULT = Path(__file__).resolve().parent / "results" / "tool_calc_curve.json"
PNG = ROOT / "docs" / "img" / "tool-calc-curve.png"
THRESHOLD, WINDOW = 0.9, 100


def run_demo(seed: int, out: Path) -> float:
    """Run the demo for ``seed`` into ``out``; its wall-clock seconds."""
    cmd = [sys.executable, "-m", "sc_trainer.cli", "--task", "tool-calc", "--seed", str(seed)]
    cmd += ["--output-dir", str(out), "--no-progress"]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _seed_of(out: Path) -> int | None:
    """The run's ``trainer.seed`` (the ``seed:`` line of its ``config.yaml``'s top-level
    ``trainer:`` section)."""
    section = ""
    for line in (out / "config.yaml").read_text().splitlines():
        if line and not line[0].isspace():
            section = line.split(":")[0]
        elif section == "trainer" and line.strip().startswith("seed:"):
            value = line.split(":", 1)[1].strip()
            return int(value) if value.isdigit() else None
    return None


def summarise(out: Path, seconds: float | None) -> dict[str, Any]:
    """One run's curves from its ``metrics.jsonl``."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [(r["step"], r["val/reward"]) for r in records if "val/reward" in r]
    steps = [r for r in records if "train/reward" in r]
    last = val[-1][0]
    tail = [v for s, v in val if s >= last - WINDOW]
    calls = [(r["step"], r["agent/tool_call_rate"]) for r in steps if r["step"] % 25 == 0]
    gaps = [r["rollout/log_prob_diff_max"] for r in steps if "rollout/log_prob_diff_max" in r]
    return {
        "seed": _seed_of(out),
        "val_reward": val,
        "tool_call_rate": calls,
        "log_prob_diff_max": max(gaps) if gaps else None,
        "seconds_total": None if seconds is None else round(seconds),
        "seconds_to_last_step": round(steps[-1]["perf/wall_clock_s"]) if steps else None,
        f"holds_{THRESHOLD}_over_last_{WINDOW}_steps": bool(tail) and min(tail) >= THRESHOLD,
    }


def plot(runs: list[dict[str, Any]]) -> None:
    curves = [(f"seed {run['seed']}", run["val_reward"]) for run in runs]
    plot_curves(
        curves, "sc-demo --task tool-calc", "validation reward (greedy, no hints)", PNG, THRESHOLD
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--from", dest="made", type=Path, nargs="+", default=None)
    args = parser.parse_args(argv)
    runs = []
    if args.made:
        runs = [summarise(out, None) for out in args.made]
    else:
        work = Path(tempfile.mkdtemp(prefix="sc-tool-calc-curve-"))
        for seed in args.seeds:
            seconds = run_demo(seed, work / f"seed-{seed}")
            runs.append(summarise(work / f"seed-{seed}", seconds))
            print(json.dumps(runs[-1]), flush=True)
    write_result(
        RESULT,
        {
            "benchmark": "sc-demo --task tool-calc: validation curves (greedy, 256 held-out "
            "problems, no hints), one run per seed",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(),
            "command": "sc-demo --task tool-calc --seed S (the task's defaults)",
            "runs": runs,
            "note": "tool_call_rate counts sessions whose policy called; 3 in 4 training "
            "sessions are hints, so 0.25 is every non-hint session",
        },
    )
    plot(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
