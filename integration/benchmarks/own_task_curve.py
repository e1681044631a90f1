"""Run the examples of your own task as a user would, and draw their validation curves beside
``sc-demo``'s (the trainer guide and the your-own-task guide show the plot).

    uv run python integration/benchmarks/own_task_curve.py
    uv run python integration/benchmarks/own_task_curve.py --from digits=examples/digits/output

Each example is copied to a temporary folder, then ``python prepare.py`` and ``sc-train
--config config.yaml`` run there in subprocesses, timed from start to exit (``--from
NAME=DIR`` reads a finished run's ``metrics.jsonl`` instead). ``sc-demo``'s PPO curve comes
from ``results/demo.json`` (``demo_curve.py``). Writes ``results/own_task.json`` and
``docs/img/own-task-curve.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
PNG = ROOT / "docs" / "img" / "own-task-curve.png"
EXAMPLES = {
    "digits": "digits (dataset + reward file, PPO)",
    "max_digit": "max_digit (outcome only, GRPO)",
}
BIN = Path(sys.executable).parent


def _curve(output: Path) -> dict[str, float]:
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return {str(r["step"]): r["val/reward"] for r in records if "val/reward" in r}


def run_example(name: str, work: Path) -> dict[str, Any]:
    """``prepare.py`` then ``sc-train`` in a copy of ``examples/<name>``."""
    folder = work / name
    skip = shutil.ignore_patterns("data", "model", "output", "hf")
    shutil.copytree(ROOT / "examples" / name, folder, ignore=skip)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "prepare.py"], cwd=folder, check=True, stdout=subprocess.DEVNULL
    )
    subprocess.run(
        [str(BIN / "sc-train"), "--config", "config.yaml"],
        cwd=folder,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    return {
        "example": name,
        "wall_s": round(wall, 1),
        "loadavg_at_start": round(load, 2),
        "val_reward": _curve(folder / "output"),
    }


def plot(runs: list[dict[str, Any]], demo: dict[str, float] | None, png: Path) -> None:
    plot_curves(
        [(EXAMPLES[run["example"]], by_step(run["val_reward"])) for run in runs],
        "sc-train on the examples' own data and rewards",
        "validation reward (greedy)",
        png,
        xlabel="training step",
        figsize=(6.4, 3.6),
        small_legend=True,
        reference=None
        if demo is None
        else ("sc-demo (built-in task, per-digit credit)", by_step(demo)),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS / "own_task.json")
    parser.add_argument("--png", type=Path, default=PNG)
    parser.add_argument(
        "--from",
        dest="finished",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="read a finished run's metrics instead",
    )
    args = parser.parse_args(argv)
    finished = dict(item.split("=", 1) for item in args.finished)
    runs = []
    with tempfile.TemporaryDirectory(prefix="sc-own-task-") as work:
        for name in EXAMPLES:
            if name in finished:
                runs.append(
                    {"example": name, "wall_s": None, "val_reward": _curve(Path(finished[name]))}
                )
            else:
                runs.append(run_example(name, Path(work)))
    demo_file = RESULTS / "demo.json"
    demo = None
    if demo_file.is_file():
        demo = next(
            r["val_reward"]
            for r in json.loads(demo_file.read_text())["runs"]
            if r["algorithm"] == "ppo"
        )
    write_result(args.out, {**stamp("own-task examples"), "runs": runs})
    plot(runs, demo, args.png)
    for run in runs:
        curve = ", ".join(f"{s}: {v:.3f}" for s, v in run["val_reward"].items())
        print(f"{run['example']}: {curve}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
