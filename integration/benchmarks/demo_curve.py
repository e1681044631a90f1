"""Run ``sc-demo`` as a user would (PPO, then GRPO, default settings) and draw the validation
curves that the README and the trainer guide show.

    uv run python integration/benchmarks/demo_curve.py
    uv run python integration/benchmarks/demo_curve.py --extra --backend local

Each run is the ``sc-demo`` command in a subprocess (its own Ray cluster), timed from start to
exit. Writes ``results/demo.json`` (each run's validation rewards by step, final entropy and
KL, wall time, the machine's load) and ``docs/img/demo-curve.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _curves import by_step, plot_curves  # this folder: the scripts' own
from _machine import stamp, write_result

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
PNG = ROOT / "docs" / "img" / "demo-curve.png"


def run_demo(algorithm: str, extra: list[str], out: Path) -> dict[str, Any]:
    """One ``sc-demo`` run; its curve and wall time."""
    cmd = [sys.executable, "-m", "sc_trainer.cli", "--algorithm", algorithm]
    cmd += ["--output-dir", str(out), "--no-progress", *extra]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    return {
        "algorithm": algorithm,
        "args": extra,
        "wall_s": round(wall, 1),
        "loadavg_at_start": round(load, 2),
        "val_reward": {str(r["step"]): r["val/reward"] for r in records if "val/reward" in r},
        "final_entropy": last.get("actor/entropy"),
        "final_kl_ref": last.get("actor/kl_ref"),
    }


def plot(runs: list[dict[str, Any]], png: Path) -> None:
    curves = [
        (
            f"{run['algorithm'].upper()} ({run['wall_s']:.0f} s for the whole command)",
            by_step(run["val_reward"]),
        )
        for run in runs
    ]
    plot_curves(
        curves,
        "uv run sc-demo: reversing 4 digits, 256 held-out prompts",
        "validation reward (greedy)",
        png,
        xlabel="training step",
        figsize=(6, 3.4),
        small_legend=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS / "demo.json")
    parser.add_argument("--png", type=Path, default=PNG)
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more sc-demo flags")
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm in ("ppo", "grpo"):
            run = run_demo(algorithm, args.extra, Path(tmp) / algorithm)
            print(json.dumps(run), flush=True)
            runs.append(run)
    write_result(args.out, {**stamp("sc-demo"), "runs": runs})
    plot(runs, args.png)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
