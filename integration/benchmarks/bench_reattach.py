"""A driver killed mid-run: re-attaching to the live workers against a cold restart.

    uv run python integration/benchmarks/bench_reattach.py       # results/reattach.json

On a standing local Ray cluster (``ray start --head``, started here with its own temp dir
and ports), the demo's run (``sc-demo``'s defaults: the built-in model, PPO, two workers per
role, colocated) is started detached (``--run-id``) for ``--steps`` steps with a checkpoint
every ``--save-every``, and its driver kills itself with SIGKILL as step ``--kill-step``
begins. Then, from that point:

* ``reattach_s``: a new driver with the same run id, from ``TaskRunner.run`` to its first
  step: connect, take the run's lease, rebuild the worker groups over the live actors, check
  their code and configuration, read the run state. No worker starts, no model loads.
* ``cold_restart_s``: a new driver that resumes the same run from the checkpoint of the
  step before (``--resume``), on new workers: the same measure, which now pays every
  worker's start-up, the model build and the checkpoint restore.

Each driver is its own process; its interpreter start and imports (Ray's included) are
not counted: they are the same for both. Connecting to the cluster is counted for both.
The figures are medians over ``--repeats`` rounds, with their ratio; the goal is
``reattach_s <= 0.1 * cold_restart_s``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _machine import machine, write_result  # this folder: the script's own


def _driver(output: str, options: dict[str, Any], connect: bool) -> int:
    """The driver process: one run of ``TaskRunner`` (``connect``: on the standing cluster
    without a run id, as a cold restart resumes), its result as one JSON line."""
    import logging
    import time

    # imported by both kinds of driver before the clock starts, as every other import
    from sc_trainer import RunConfig, TaskConfig, TaskRunner, TrainerConfig
    from sc_trainer.launch._connect import prepare_ray_environment

    prepare_ray_environment()  # Ray's auth mode, decided before Ray is imported
    import ray

    logging.basicConfig(level=logging.WARNING)
    connect_s = 0.0
    if connect:  # a detached driver connects inside TaskRunner.run, so its startup counts it
        started = time.perf_counter()
        ray.init(address="auto", log_to_driver=False)
        connect_s = time.perf_counter() - started
    run = RunConfig(**options.pop("run", {}))
    task = TaskConfig(**options.pop("task", {}))
    config = TrainerConfig(output_dir=output, run=run, task=task, **options)
    result = TaskRunner(config).run()
    startup = connect_s + result.startup_seconds
    print(json.dumps({"startup_s": startup, "final_step": result.final_step}))
    return 0


def _run(cluster: Any, output: Path, options: dict[str, Any], connect: bool = False) -> Any:
    args = [sys.executable, __file__, "--driver", str(output), json.dumps(options)]
    if connect:
        args.append("--connect")
    return subprocess.run(args, env=cluster.env(), capture_output=True, text=True, timeout=900)


def _startup(done: Any) -> float:
    if done.returncode != 0:
        raise RuntimeError(f"driver failed ({done.returncode}): {done.stderr[-3000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["startup_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--kill-step", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    default_out = Path(__file__).parent / "results" / "reattach.json"
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--driver", nargs=2, metavar=("OUTPUT", "OPTIONS"), help=argparse.SUPPRESS)
    parser.add_argument("--connect", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver is not None:
        return _driver(args.driver[0], json.loads(args.driver[1]), args.connect)

    from sc_integration._standing_cluster import StandingCluster

    base = {"steps": args.steps, "save_every": args.save_every, "val_every": args.steps}
    reattach, cold = [], []
    with tempfile.TemporaryDirectory(prefix="sc-bench-") as tmp:
        cluster = StandingCluster(Path(tmp) / "ray")
        try:
            for round_ in range(args.repeats):
                out = Path(tmp) / f"run{round_}"
                detached = {**base, "run": {"id": f"bench-reattach-{round_}"}}
                killed = _run(
                    cluster, out, {**detached, "inject_fault": f"driver@step={args.kill_step}"}
                )
                if killed.returncode != -9:
                    raise RuntimeError(f"the first driver was not killed: {killed.stderr[-3000:]}")
                reattach.append(_startup(_run(cluster, out, detached)))
                checkpoint = out / "checkpoints" / f"global_step_{args.kill_step - 1}"
                cold_options = {**base, "resume_from": str(checkpoint)}
                cold_out = Path(tmp) / f"cold{round_}"
                cold.append(_startup(_run(cluster, cold_out, cold_options, connect=True)))
                print(
                    f"round {round_}: re-attach {reattach[-1]:.2f} s, cold restart "
                    f"{cold[-1]:.2f} s",
                    flush=True,
                )
        finally:
            cluster.stop()
    result = {
        "benchmark": "reattach",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "config": {**base, "kill_step": args.kill_step, "repeats": args.repeats},
        "reattach_s": reattach,
        "cold_restart_s": cold,
        "reattach_median_s": statistics.median(reattach),
        "cold_restart_median_s": statistics.median(cold),
        "ratio": statistics.median(reattach) / statistics.median(cold),
    }
    print(
        f"re-attach and resume: {result['reattach_median_s']:.2f} s; cold restart from the "
        f"same step's checkpoint: {result['cold_restart_median_s']:.2f} s; ratio "
        f"{result['ratio']:.3f} (goal <= 0.1)"
    )
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
