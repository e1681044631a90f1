"""The asynchronous trainer against the synchronous one: wall time per step, the overlap of
generation and update, and the validation reward.

    uv run python integration/benchmarks/bench_async.py     # results/async.json

Both runs are the demo's PPO configuration with the rollout on a group of its own
(``placement="separate"``, 2 actor + 2 rollout processes) on Ray, for ``--steps`` steps: the
synchronous loop (``async_staleness=0``) and the asynchronous one (``async_staleness=1``).
They alternate ``--repeat`` times, so a machine that gets busier during the benchmark slows
both. Reported per run:

* ``step_s``: the median wall time of a step on the driver (``perf/step_time_s``, every
  stage from taking the batch to the weight sync), steps 3 onwards;
* ``fit_s``: the whole ``fit`` over the steps (validations and checkpoints included);
* ``generate_s`` / ``train_s``: the time generation and the actor's and critic's calls
  (log-probs, values, updates) took, from the run's call spans: blocking
  ``generate_sequences`` calls for k = 0, the driver spans ``generate_async`` (from the
  non-blocking launch to the batch's arrival) for k = 1;
* ``overlap_s``: the time both ran at once (the intersection of the two unions of
  intervals), and ``overlap_of_generate``: that as a fraction of ``generate_s``;
* ``val_reward``: the validation reward after the last step (greedy, 256 held-out prompts);
* ``stage_s``: the median seconds of each stage of a step as the driver saw them
  (``timing/<stage>``; for k = 1 ``generate`` is the wait for the prefetched batch, and there
  is no ``old_log_prob``: the rollout's log-probs replace that pass).

The ratios (k = 1 over k = 0) are the figures of docs/performance.md's "Async training".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from _machine import local_ray, write_measurement  # this folder: the script's own
from sc_core import CallSpan, SpanRecorder
from sc_trainer import TaskRunner, TrainerConfig, make_launcher

#: the actor's and the critic's calls of a step (the work generation may overlap)
TRAIN_METHODS = (
    "compute_log_prob",
    "compute_ref_log_prob",
    "compute_values",
    "update_critic",
    "update_actor",
)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    total = 0.0
    for s1, e1 in a:
        for s2, e2 in b:
            total += max(0.0, min(e1, e2) - max(s1, s2))
    return total


def overlap(spans: list[CallSpan], training_from: float) -> dict[str, float]:
    """Generation vs training time in ``spans`` (those that start at ``training_from`` or
    later: the training steps, not the set-up)."""
    gen: list[tuple[float, float]] = []
    train: list[tuple[float, float]] = []
    for span in spans:
        if span.end is None or span.start < training_from:
            continue
        interval = (span.start, span.end)
        if span.method == "generate_async" or (
            span.method == "generate_sequences" and span.blocking
        ):
            gen.append(interval)
        elif span.method.endswith(TRAIN_METHODS):  # a fused group's names carry a prefix
            train.append(interval)
    g, t = _union(gen), _union(train)
    both = _intersection(g, t)
    return {
        "generate_s": _length(g),
        "train_s": _length(t),
        "overlap_s": both,
        "overlap_of_generate": both / _length(g) if g else 0.0,
    }


def one_run(staleness: int, steps: int, out_dir: Path) -> dict[str, Any]:
    config = TrainerConfig(
        placement="separate",
        async_staleness=staleness,
        steps=steps,
        val_every=steps,
        save_every=steps,
        output_dir=str(out_dir),
    )
    runner = TaskRunner(config)
    launcher = make_launcher(config)
    started: list[float] = []
    with launcher.running(), SpanRecorder() as recorder:
        trainer = runner.build_trainer(launcher)
        trainer.init_workers()
        try:
            t0 = time.perf_counter()
            result = trainer.fit(on_start=lambda _step: started.append(time.time()))
            fit_s = time.perf_counter() - t0
        finally:
            trainer.close()
        spans = recorder.spans
    steps_run = [r for r in result.history if r["step"] > 0 and "perf/step_time_s" in r]
    step_times = [r["perf/step_time_s"] for r in steps_run if r["step"] >= 3]
    staleness_seen = [r.get("rollout/staleness", 0) for r in steps_run]
    stage_keys = sorted({k for r in steps_run for k in r if k.startswith("timing/")})
    stages = {
        k.removeprefix("timing/"): statistics.median(r.get(k, 0.0) for r in steps_run[2:])
        for k in stage_keys
    }
    return {
        "async_staleness": staleness,
        "steps": steps,
        "step_s": statistics.median(step_times),
        "step_s_mean": statistics.fmean(step_times),
        "fit_s": fit_s,
        "val_reward": result.last_val_reward,
        "max_staleness": max(staleness_seen),
        "stage_s": stages,
        **overlap(spans, started[0] if started else 0.0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path("integration/benchmarks/results/async.json")
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="8 steps, one repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeat = 8, 1
    loadavg = list(os.getloadavg())
    runs: list[dict[str, Any]] = []
    # one cluster for every run (the trainer's launcher uses a running one and leaves it up)
    num_cpus = TrainerConfig(placement="separate").ray_num_cpus
    with local_ray(num_cpus), tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for k in (0, 1):
                run = one_run(k, args.steps, Path(tmp) / f"k{k}-{i}")
                print(run, flush=True)
                runs.append(run)
    med = statistics.median

    def summary(k: int) -> dict[str, float]:
        mine = [r for r in runs if r["async_staleness"] == k]
        keys = ("step_s", "fit_s", "val_reward", "generate_s", "train_s", "overlap_s")
        out = {key: med(r[key] for r in mine) for key in keys}
        out["overlap_of_generate"] = med(r["overlap_of_generate"] for r in mine)
        return out

    sync, asyn = summary(0), summary(1)
    result = {
        "sync": sync,
        "async_k1": asyn,
        "step_time_ratio": asyn["step_s"] / sync["step_s"],
        "fit_time_ratio": asyn["fit_s"] / sync["fit_s"],
        "val_reward": {"sync": sync["val_reward"], "async_k1": asyn["val_reward"]},
        "runs": runs,
    }
    write_measurement(
        args.out,
        "async trainer (k=1) vs synchronous (k=0), separate rollout on Ray",
        result,
        quick=args.quick,
        leave_out="runs",
        ray=ray.__version__,
        loadavg_at_start=loadavg,
        loadavg_at_end=list(os.getloadavg()),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
