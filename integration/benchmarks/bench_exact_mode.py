"""The exact mode's cost: the demo's PPO run with and without ``exact_window``.

    uv run python integration/benchmarks/bench_exact_mode.py     # results/exact_mode.json

Both runs are ``sc-demo``'s default configuration (PPO, 2 workers per role, the critic
colocated, Ray) for ``--steps`` steps on the worker groups' sampler; the exact one adds
``exact_window=16`` (the digit task's 5 prompt and 5 response tokens with room) and
``exact_check``. They alternate ``--repeat`` times, so a machine that gets busier slows both.
Reported per run: the median step time (``perf/step_time_s``, steps 3 on), the median
generation and old-log-prob stage times, the largest ``rollout/log_prob_diff_max`` and
``actor/ppo_ratio_first_dev_max`` over the steps, and the validation reward at the end. The
ratios (exact over batched) are the figures of docs/performance.md's "The exact mode".
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
from pathlib import Path
from typing import Any

import ray
from _machine import machine, write_result  # this folder: the script's own
from sc_trainer import TaskRunner, TrainerConfig

WINDOW = 16


def _run(steps: int, window: int, out: Path) -> dict[str, Any]:
    config = TrainerConfig(
        steps=steps,
        val_every=steps,
        save_every=steps,
        output_dir=str(out),
        exact_window=window,
        exact_check=bool(window),
    )
    result = TaskRunner(config).run()
    records = [r for r in result.history if "train/reward" in r]
    later = records[2:] or records

    def median(key: str) -> float:
        return statistics.median(float(r[key]) for r in later)

    return {
        "step_s": median("perf/step_time_s"),
        "generate_s": median("timing/generate"),
        "old_log_prob_s": median("timing/old_log_prob"),
        "update_actor_s": median("timing/update_actor"),
        "log_prob_diff_max": max(float(r["rollout/log_prob_diff_max"]) for r in records),
        "first_ratio_dev_max": max(float(r["actor/ppo_ratio_first_dev_max"]) for r in records),
        "val_reward": result.last_val_reward,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "exact_mode.json"
    )
    args = parser.parse_args(argv)
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    runs: dict[str, list[dict[str, Any]]] = {"batched": [], "exact": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeat):
                for name, window in (("batched", 0), ("exact", WINDOW)):
                    runs[name].append(_run(args.steps, window, Path(tmp) / f"{name}-{i}"))
    finally:
        ray.shutdown()

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    ratios = {
        key: med("exact", key) / med("batched", key)
        for key in ("step_s", "generate_s", "old_log_prob_s", "update_actor_s")
    }
    out = {
        "date": dt.date.today().isoformat(),
        "machine": machine(),
        "steps": args.steps,
        "window": WINDOW,
        "runs": runs,
        "exact_over_batched": ratios,
    }
    for name in runs:
        print(
            f"{name}: step {med(name, 'step_s'):.3f} s, generate {med(name, 'generate_s'):.3f} s, "
            f"max |diff| {max(r['log_prob_diff_max'] for r in runs[name]):.3g}, first ratio dev "
            f"{max(r['first_ratio_dev_max'] for r in runs[name]):.3g}"
        )
    print("exact / batched:", {k: round(v, 2) for k, v in ratios.items()})
    write_result(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
