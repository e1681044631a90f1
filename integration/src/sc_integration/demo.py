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
from typing import Any

from ._config import ALGORITHMS, BACKENDS, DEVICES, PLACEMENTS, TrainerConfig
from ._errors import ScIntegrationError
from ._runner import TaskRunner
from ._task import TASK_MODES, TaskConfig

__all__ = ["build_parser", "config_from_args", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``sc-demo`` command line."""
    d = TrainerConfig()
    t = d.task
    parser = argparse.ArgumentParser(
        prog="sc-demo",
        description=(
            "Train a tiny causal transformer from scratch, by RL alone, to answer a string of "
            "digits reversed; every stage runs on a worker group driven from this process. "
            "Writes metrics.jsonl, metrics.png, trace.json and checkpoints/ to --output-dir."
        ),
    )
    run = parser.add_argument_group("run")
    add = run.add_argument
    add(
        "--algorithm",
        choices=ALGORITHMS,
        default=d.algorithm,
        help=f"ppo (actor + critic, GAE) or grpo (group-normalised rewards) "
        f"(default: {d.algorithm})",
    )
    add(
        "--steps",
        type=int,
        default=d.steps,
        help=f"total training steps, counting those a resumed run starts from (default: {d.steps})",
    )
    add(
        "--workers-per-role",
        "--n-workers",
        dest="workers_per_role",
        type=int,
        default=None,
        help=f"data-parallel workers per role (default: {d.workers_per_role} on ray, 1 on local)",
    )
    add(
        "--colocate",
        action=argparse.BooleanOptionalAction,
        default=d.colocate,
        help="run the critic in the actor/rollout/ref processes, or in a resource pool of its "
        "own (default: colocated)",
    )
    add(
        "--placement",
        choices=PLACEMENTS,
        default=None,
        help="colocated: sample with the actor's model in its processes; separate: sample on a "
        "rollout group of its own, whose weights follow the actor's by a weight sync after "
        f"every update (default: {d.placement}; separate with --async-staleness above 0)",
    )
    add(
        "--rollout-tp",
        type=int,
        default=d.rollout_tp,
        help="tensor-parallel size of a separately placed rollout (default: 1)",
    )
    add(
        "--async-staleness",
        type=int,
        default=d.async_staleness,
        metavar="K",
        help="generate the next batch on a separately placed rollout (implies --placement "
        "separate) while the actor trains on this one, from weights at most K updates old, "
        f"the PPO ratio against the sampling policy; 0: synchronous (default: "
        f"{d.async_staleness})",
    )
    add(
        "--backend",
        choices=BACKENDS,
        default=d.backend,
        help="ray: a local Ray cluster started for the run; local: everything in this process "
        f"(world size 1 per role) (default: {d.backend})",
    )
    add(
        "--output-dir",
        default=d.output_dir,
        metavar="DIR",
        help=f"where the run writes (default: {d.output_dir})",
    )
    add(
        "--resume-from",
        default=None,
        metavar="PATH",
        help="continue from a checkpoint folder, or from an output folder's newest checkpoint",
    )
    add(
        "--seed",
        type=int,
        default=d.seed,
        help=f"seed of the prompts, the model initialisation and sampling (default: {d.seed})",
    )
    add(
        "--num-cpus",
        type=int,
        default=None,
        help="CPUs the local Ray cluster declares (default: enough for the workers)",
    )
    train = parser.add_argument_group("training")
    add = train.add_argument
    add(
        "--prompts-per-step",
        type=int,
        default=d.prompts_per_step,
        help=f"prompts per step (default: {d.prompts_per_step})",
    )
    add(
        "--responses-per-prompt",
        type=int,
        default=d.responses_per_prompt,
        help=f"samples per prompt (the GRPO group size) (default: {d.responses_per_prompt})",
    )
    add(
        "--actor-lr",
        type=float,
        default=d.actor_lr,
        help=f"actor learning rate (default: {d.actor_lr})",
    )
    add(
        "--critic-lr",
        type=float,
        default=d.critic_lr,
        help=f"critic learning rate (default: {d.critic_lr})",
    )
    add(
        "--ppo-epochs",
        type=int,
        default=d.ppo_epochs,
        help=f"passes over each batch per update (default: {d.ppo_epochs})",
    )
    add(
        "--ppo-mini-batches",
        type=int,
        default=d.ppo_mini_batches,
        help=f"optimizer steps per pass (default: {d.ppo_mini_batches})",
    )
    add(
        "--kl-coef",
        type=float,
        default=d.kl_coef,
        help=f"weight of the actor's KL-to-reference loss (default: {d.kl_coef})",
    )
    add(
        "--entropy-coeff",
        type=float,
        default=d.entropy_coeff,
        help=f"weight of the actor's entropy bonus (default: {d.entropy_coeff})",
    )
    add(
        "--val-every",
        type=int,
        default=d.val_every,
        help=f"validate every N steps, before the first and after the last "
        f"(default: {d.val_every})",
    )
    add(
        "--save-every",
        type=int,
        default=d.save_every,
        help=f"checkpoint every N steps, and after the last (default: {d.save_every})",
    )
    add(
        "--absolute-positions",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="give the built-in model learned absolute position embeddings besides its rotary "
        "ones; without them it does not learn to reverse the digits (default: on, except "
        "with --model)",
    )
    add(
        "--model",
        dest="model_path",
        default=None,
        metavar="PATH",
        help="train the local Hugging Face causal-LM directory PATH (config, weights, "
        "tokenizer) on the task as text, instead of the built-in model (needs sc-workers[hf])",
    )
    add(
        "--device",
        choices=DEVICES,
        default=d.device,
        help=f"where the workers compute; cuda gives each worker process one GPU "
        f"(default: {d.device})",
    )
    add(
        "--task",
        dest="task_mode",
        choices=TASK_MODES,
        default=t.mode,
        help=f"answer the digits reversed, or copied (default: {t.mode})",
    )
    add(
        "--task-length", type=int, default=t.length, help=f"digits per prompt (default: {t.length})"
    )
    faults = parser.add_argument_group("fault tolerance")
    faults.add_argument(
        "--inject-fault",
        metavar="ROLE:RANK@step=N[:METHOD[+S]][:raise]",
        default=None,
        help="kill rank RANK of ROLE's group (actor, critic or rollout) when step N begins, "
        "to watch the run recover in place, e.g. actor:1@step=30; with METHOD, kill it S "
        "seconds into that method from step N on (or make the method raise, which ends the "
        "run); several faults are separated by commas (default: no fault)",
    )
    faults.add_argument(
        "--standby",
        type=int,
        default=d.standby,
        help="spare worker processes per worker group (ray), started up front, that take "
        f"over a dead rank without a process start-up (default: {d.standby})",
    )
    faults.add_argument(
        "--max-recoveries",
        type=int,
        default=d.max_recoveries,
        help=f"worker deaths one run recovers from (default: {d.max_recoveries})",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="print one line per step instead of the progress bar",
    )
    out.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="INFO logs every step's metrics (default: WARNING)",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> TrainerConfig:
    """The :class:`TrainerConfig` the parsed command line asks for."""
    return TrainerConfig(
        algorithm=args.algorithm,
        backend=args.backend,
        steps=args.steps,
        workers_per_role=(
            args.workers_per_role
            if args.workers_per_role is not None
            else (1 if args.backend == "local" else TrainerConfig.workers_per_role)
        ),
        colocate=args.colocate,
        placement=(
            args.placement
            if args.placement is not None
            else ("separate" if args.async_staleness > 0 else TrainerConfig.placement)
        ),
        rollout_tp=args.rollout_tp,
        async_staleness=args.async_staleness,
        seed=args.seed,
        output_dir=args.output_dir,
        resume_from=args.resume_from,
        num_cpus=args.num_cpus,
        prompts_per_step=args.prompts_per_step,
        responses_per_prompt=args.responses_per_prompt,
        actor_lr=args.actor_lr,
        critic_lr=args.critic_lr,
        kl_coef=args.kl_coef,
        ppo_epochs=args.ppo_epochs,
        ppo_mini_batches=args.ppo_mini_batches,
        val_every=args.val_every,
        save_every=args.save_every,
        entropy_coeff=args.entropy_coeff,
        absolute_positions=args.absolute_positions,
        model_path=args.model_path,
        device=args.device,
        inject_fault=args.inject_fault,
        standby=args.standby,
        max_recoveries=args.max_recoveries,
        task=TaskConfig(length=args.task_length, mode=args.task_mode),
    )


class _Progress:
    """A tqdm bar with the live reward and step time, or one log line per step."""

    def __init__(self, total: int, enabled: bool) -> None:
        # tqdm ships no type information; the bar is used through four plain methods
        tqdm: Any = importlib.import_module("tqdm").tqdm
        self._bar = tqdm(
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``sc-demo``; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    try:
        config = config_from_args(args)
    except ScIntegrationError as err:
        build_parser().error(str(err))
    progress = _Progress(config.steps, enabled=args.progress)
    started = time.perf_counter()
    try:
        result = TaskRunner(config).run(progress=progress, on_start=progress.start_at)
    except ScIntegrationError as err:
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
        f"    plot:         {result.output.plot_path.name}",
        f"    trace:        {result.output.trace_path.name}",
        f"    checkpoint:   {result.checkpoint.relative_to(result.output.root)}",
    ]
    print("\n".join(lines))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
