"""Does a checkpoint save block the training step? Step times with and without a save.

    uv run python integration/benchmarks/bench_checkpoint.py     # results/checkpoint.json

A PPO run on Ray (actor and critic colocated, FSDP over ``--workers`` processes, a model of
``--hidden`` x ``--layers`` so that the state to write is tens of megabytes per rank) saves
a checkpoint every ``--save-every`` steps, once with the workers writing in the background
(``background_checkpoints=True``, the default) and once blocking. The time of a step is the
wall time between two consecutive step ends as the driver sees them, so it holds the save
that followed the previous step, if any:

* ``with_save_s``: the median step that followed a save (it paid for the save, or for the
  copy into memory and for the writes running beside it);
* ``without_save_s``: the median step that followed none;
* ``ratio``: with over without. The issue's goal for background saves: within 10 %.

The first steps (start-up, the save before the first step) are left out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from _machine import local_ray, stamp, write_result  # this folder: the script's own
from sc_trainer import TaskConfig, TaskRunner, TrainerConfig


def run(background: bool, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    config = TrainerConfig(
        steps=args.steps,
        prompts_per_step=8,
        responses_per_prompt=2,
        workers_per_role=args.workers,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=8,
        val_every=args.steps,
        save_every=args.save_every,
        keep_checkpoints=2,
        background_checkpoints=background,
        output_dir=str(out_dir),
        task=TaskConfig(length=3, num_val=16),
    )
    ends: dict[int, float] = {}

    def progress(step: int, metrics: dict[str, Any]) -> None:
        if "recovery/count" not in metrics:
            ends[step] = time.perf_counter()

    result = TaskRunner(config).run(progress=progress)
    with_save, without = [], []
    for step in range(args.skip + 1, args.steps + 1):
        if step - 1 not in ends:
            continue
        seconds = ends[step] - ends[step - 1]
        (with_save if (step - 1) % args.save_every == 0 else without).append(seconds)
    state_mb = sum(p.stat().st_size for p in result.checkpoint.rglob("rank_*.pt")) / 2**20
    return {
        "background": background,
        "with_save_s": statistics.median(with_save),
        "without_save_s": statistics.median(without),
        "ratio": statistics.median(with_save) / statistics.median(without),
        "checkpoint_mb": state_mb,
        "samples": {"with_save": with_save, "without_save": without},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path("integration/benchmarks/results/checkpoint.json")
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out")
    parser.add_argument("--quick", action="store_true", help="a small model, 8 steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.steps = 128, 2, 8
    with local_ray(max(8, args.workers + 1)), tempfile.TemporaryDirectory() as tmp:
        results = [
            run(background, args, Path(tmp) / f"bg{background}") for background in (True, False)
        ]
    out = {
        **stamp("step time with and without a checkpoint save", ray=ray.__version__),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "results": results,
    }
    for r in results:
        print({k: v for k, v in r.items() if k != "samples"}, flush=True)
    write_result(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
