"""``sc-demo``: train a tiny policy by RL on a local Ray cluster and write what happened.

Run ``uv run sc-demo --help`` for the options. The run starts its own Ray cluster
(``--backend ray``, the default) or runs every worker in this process (``--backend local``,
for a debugger), trains with PPO or GRPO on the digit-reversal task, and writes an output
folder: ``metrics.jsonl``, ``metrics.png``, ``trace.json`` and ``checkpoints/``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._errors import ScTrainerError
from ..config import TrainerConfig, add_options, check_run_id, config_kwargs
from ..launch import TaskRunner, teardown_detached_run
from ._errors import user_errors

# tqdm ships no type information; the bar is used through four plain methods
_tqdm: Any = importlib.import_module("tqdm").tqdm

__all__ = ["build_parser", "config_from_args", "demo_main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``sc-demo`` command line: one flag per :class:`TrainerConfig` field declared with
    :func:`~sc_trainer.config.option` (name, type, default, help and choices come
    from the field), and the output flags of this command."""
    parser = argparse.ArgumentParser(
        prog="sc-demo",
        description=(
            "Train a tiny causal transformer from scratch, by RL alone, to answer a string of "
            "digits reversed; every stage runs on a worker group driven from this process. "
            "Writes metrics.jsonl, metrics.png, trace.json and checkpoints/ to --output-dir."
        ),
    )
    add_options(parser, TrainerConfig)
    out = parser.add_argument_group("output")
    out.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="print one line per step instead of the progress bar",
    )
    out.add_argument(
        "--teardown",
        metavar="ID",
        help="release every worker and placement group of the detached run ID (on the "
        "cluster --address names) and exit",
    )
    out.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="INFO logs every step's metrics (default: WARNING)",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> TrainerConfig:
    """The :class:`TrainerConfig` the parsed command line asks for (a flag not given takes
    the field's default, or the value its field derives from the other flags:
    ``--async-staleness`` above 0 implies ``--placement separate``, ``--backend local`` one
    worker per role)."""
    return TrainerConfig(**config_kwargs(TrainerConfig, vars(args)))


class _Progress:
    """A tqdm bar with the live reward and step time, or one log line per step."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar = _tqdm(
            total=total, desc="sc-demo", unit="step", disable=not enabled, dynamic_ncols=True
        )
        self._enabled = enabled
        self._last = time.perf_counter()
        self._recoveries = 0

    def start_at(self, step: int) -> None:
        """The workers are up and the run continues from ``step``: start the clock."""
        self._bar.n = step
        self._bar.refresh()
        self._last = time.perf_counter()

    def __call__(self, step: int, metrics: Mapping[str, Any]) -> None:
        if "recovery/count" in metrics and "train/reward" not in metrics:
            self._recovered(step, metrics)
            return
        now = time.perf_counter()
        step_time, self._last = now - self._last, now
        post = {
            "reward": f"{metrics.get('train/reward', float('nan')):.3f}",
            "step_s": f"{step_time:.2f}",
        }
        if "val/reward" in metrics:
            post["val"] = f"{metrics['val/reward']:.3f}"
        if self._recoveries:
            post["recoveries"] = str(self._recoveries)
        if self._enabled:
            self._bar.set_postfix(post, refresh=False)
            self._bar.update(step - self._bar.n)
        else:
            line = " ".join(f"{k}={v}" for k, v in post.items())
            print(f"sc-demo: step {step}/{self._bar.total} {line}", flush=True)  # noqa: T201

    def _recovered(self, step: int, metrics: Mapping[str, Any]) -> None:
        """A worker died during step ``failed_step``; the run is back at ``step``."""
        line = (
            f"sc-demo: a worker died in step {metrics['recovery/failed_step']}; replaced it and "
            f"restored step {step} in {metrics['recovery/seconds']:.1f} s "
            f"(recovery {metrics['recovery/count']})"
        )
        self._recoveries = int(metrics["recovery/count"])
        if self._enabled:
            self._bar.write(line)
            self._bar.n = step
            self._bar.set_postfix({"recoveries": self._recoveries}, refresh=True)
        else:
            print(line, flush=True)  # noqa: T201
        self._last = time.perf_counter()

    def close(self) -> None:
        self._bar.close()


def demo_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``sc-demo`` (:func:`sc_trainer.cli.demo_main`); returns the exit
    status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    if args.teardown is not None:
        return _teardown(args.teardown, args.run_address)
    try:
        config = config_from_args(args)
    except ScTrainerError as err:
        build_parser().error(str(err))
    progress = _Progress(config.total_steps, enabled=args.progress)
    started = time.perf_counter()
    try:
        result = TaskRunner(config).run(progress=progress, on_start=progress.start_at)
    except Exception as err:
        if not isinstance(err, user_errors()):
            raise
        progress.close()
        print(f"sc-demo: error: {err}", file=sys.stderr)  # noqa: T201
        return 1
    progress.close()
    lines = [
        f"sc-demo: {config.algorithm} on the {config.backend} backend, "
        f"{result.final_step} steps; {time.perf_counter() - started:.0f} s in all, "
        f"{result.seconds:.0f} s of it training",
        f"  validation reward: {result.first_val_reward:.3f} before -> "
        f"{result.last_val_reward:.3f} after",
        f"  output folder:  {result.output.root.resolve()}",
        f"    metrics:      {result.output.metrics_path.name}",
        f"    plot:         {_plot_line(result.output.plot_path)}",
        f"    trace:        {result.output.trace_path.name}",
        f"    checkpoint:   {result.checkpoint.relative_to(result.output.root)}",
    ]
    print("\n".join(lines))  # noqa: T201
    return 0


def _plot_line(path: Path) -> str:
    """The plot's name, or why there is none (matplotlib is the extra ``sc-trainer[plot]``)."""
    if path.is_file():
        return path.name
    return "not drawn (pip install 'sc-trainer[plot]' draws it)"


def _teardown(run_id: str, address: str | None) -> int:
    """``sc-demo --teardown ID``: release the run's actors and placement groups."""
    try:
        check_run_id("sc-demo --teardown", run_id)
        info = teardown_detached_run(run_id, address)
    except Exception as err:
        if not isinstance(err, user_errors()):
            raise
        print(f"sc-demo: error: {err}", file=sys.stderr)  # noqa: T201
        return 1
    print(  # noqa: T201
        f"sc-demo: run {run_id} torn down: {len(info.actors)} actors and "
        f"{len(info.placement_groups)} placement groups released"
    )
    return 0
