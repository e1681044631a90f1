"""Run ``sc-demo`` on one tiny GPT-2 with each rollout (the actor's worker group, the
built-in engine's servers, vLLM's servers) and draw their validation curves side by side.

    uv run python integration/benchmarks/rollout_curve.py

Each run is the ``sc-demo`` command in a subprocess (its own Ray cluster), timed from start
to exit, PPO with the default settings. The model is the tiny GPT-2 that ``--rollout
builtin|vllm`` builds when no ``--model`` is given (seed 0); the worker-group run gets the
same one through ``--model``. Writes ``results/rollout_curve.json`` and
``docs/img/rollout-curve.png``. vLLM's environment is made first if it is missing.
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

from _curves import plot_curves  # this folder: the scripts' own
from _machine import stamp, write_result
from sc_rollout.engines import create_vllm_env
from sc_trainer.tasks import save_tiny_gpt2

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
PNG = ROOT / "docs" / "img" / "rollout-curve.png"

ROLLOUTS = ("workers", "builtin", "vllm")


def run_demo(rollout: str, model: str, out: Path, steps: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "sc_trainer.cli", "--rollout", rollout]
    cmd += ["--steps", str(steps), "--output-dir", str(out), "--no-progress"]
    if rollout == "workers":
        cmd += ["--model", model]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["val/reward"]) for r in records if "val/reward" in r]
    steps_done = [r for r in records if "train/reward" in r]
    gaps = [
        r["rollout/log_prob_diff_mean"] for r in steps_done if "rollout/log_prob_diff_mean" in r
    ]
    step_times = sorted(r["perf/step_time_s"] for r in steps_done)
    return {
        "rollout": rollout,
        "command": " ".join(["sc-demo", *cmd[3:]]),
        "val_reward": curve,
        "seconds": seconds,
        "median_step_s": step_times[len(step_times) // 2],
        "log_prob_diff_mean": sum(gaps) / len(gaps) if gaps else None,
        "log_prob_diff_max": max(gaps) if gaps else None,
        "loadavg_at_start": load,
    }


def plot(runs: list[dict[str, Any]]) -> None:
    curves = [(f"--rollout {run['rollout']}", run["val_reward"]) for run in runs]
    plot_curves(
        curves, "sc-demo on a tiny GPT-2: who generates", "validation reward (greedy)", PNG, 0.9
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rollouts", nargs="+", default=list(ROLLOUTS), choices=ROLLOUTS)
    args = parser.parse_args(argv)
    if "vllm" in args.rollouts:
        create_vllm_env()
    work = Path(tempfile.mkdtemp(prefix="sc-rollout-curve-"))
    model = save_tiny_gpt2(work / "model", seed=0)
    runs = []
    for rollout in args.rollouts:
        run = run_demo(rollout, model, work / rollout, args.steps)
        print(json.dumps(run), flush=True)
        runs.append(run)
    out = {**stamp("sc-demo validation curves on one tiny GPT-2, by rollout"), "runs": runs}
    write_result(RESULTS / "rollout_curve.json", out)
    plot(runs)
    print(f"wrote {PNG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
