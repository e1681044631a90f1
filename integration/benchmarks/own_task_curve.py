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
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

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
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    if demo is not None:
        ax.plot(
            [int(s) for s in demo],
            list(demo.values()),
            marker=".",
            color="grey",
            label="sc-demo (built-in task, per-digit credit)",
        )
    for run in runs:
        steps = [int(s) for s in run["val_reward"]]
        ax.plot(steps, list(run["val_reward"].values()), marker="o", label=EXAMPLES[run["example"]])
    ax.axhline(0.9, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("training step")
    ax.set_ylabel("validation reward (greedy)")
    ax.set_ylim(0, 1.05)
    ax.set_title("sc-train on the examples' own data and rewards")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


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
    result = {
        "benchmark": "own-task examples",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(runs, demo, args.png)
    for run in runs:
        curve = ", ".join(f"{s}: {v:.3f}" for s, v in run["val_reward"].items())
        print(f"{run['example']}: {curve}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
