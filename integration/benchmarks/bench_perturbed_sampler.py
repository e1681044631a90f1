"""A deliberately perturbed sampler: does the rollout correction rescue training?

    uv run python integration/benchmarks/bench_perturbed_sampler.py

writes ``results/perturbed_sampler.json``.

The demo's PPO run (the digit-reversal task, the built-in model) on the in-process backend
(``backend="local"``: the workers run in this process, so the sampler can be patched here),
with the worker groups' sampler made to sample from a distorted policy: a fixed random bias of
scale ``--noise`` (one value per token id, drawn once from a seeded normal) is added to its
logits before it draws a token, and it reports the log-prob of that distorted distribution, as
an honest engine with other numerics would. The actor recomputes the undistorted policy, so
the batch is off policy by a fixed, large amount. Five runs per trainer seed (``--seeds``),
each ``--steps`` steps:

* ``clean``: no bias (the reference);
* ``perturbed``: the bias, no correction (the PPO ratio is taken against the actor's
  recomputation, as usual);
* ``is_token``, ``is_sequence``: the bias, and ``algorithm.rollout_correction``'s truncated
  importance sampling at token or sequence level (cap 2);
* ``is_rs_token``: token-level truncated importance sampling and token rejection outside
  [0.5, 2].

Reported per run: the validation reward (greedy, unbiased: the actor's own policy) at each
validation, and the mismatch metrics of the last step. The trainer guide's "A perturbed sampler"
quotes them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
from pathlib import Path
from typing import Any

import torch
from _machine import machine, write_result  # this folder: the script's own
from sc_trainer import TaskRunner, TrainerConfig
from sc_trainer.config import RolloutCorrectionConfig
from sc_workers.workers import BatchSampling, _sampling

_ORIGINAL = (_sampling._next_token, _sampling._token_log_prob)


def _perturb(noise: float) -> None:
    """Bias the sampler's logits by a fixed random vector of scale ``noise``."""
    bias = noise * torch.randn(1 << 16, generator=torch.Generator().manual_seed(1234))
    next_token, token_log_prob = _ORIGINAL

    def biased(logits: torch.Tensor) -> torch.Tensor:
        return logits + bias[: logits.shape[-1]].to(logits.device)

    sampling = [False]  # whether the current generate call samples (validation is greedy)

    def biased_next_token(
        logits: torch.Tensor, params: BatchSampling, generator: torch.Generator
    ) -> torch.Tensor:
        sampling[0] = bool(params.do_sample)
        return next_token(biased(logits) if sampling[0] else logits, params, generator)

    def biased_log_prob(
        logits: torch.Tensor, token: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        return token_log_prob(biased(logits) if sampling[0] else logits, token, temperature)

    _sampling._next_token = biased_next_token
    _sampling._token_log_prob = biased_log_prob


def _restore() -> None:
    _sampling._next_token, _sampling._token_log_prob = _ORIGINAL


#: the corrections compared (verl's ``algorithm.rollout_correction`` settings)
CORRECTIONS = {
    "clean": RolloutCorrectionConfig(),
    "perturbed": RolloutCorrectionConfig(),
    "is_token": RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0),
    "is_sequence": RolloutCorrectionConfig(rollout_is="sequence", rollout_is_threshold=2.0),
    "is_rs_token": RolloutCorrectionConfig(
        rollout_is="token",
        rollout_is_threshold=2.0,
        rollout_rs="token",
        rollout_rs_threshold=2.0,
        rollout_rs_threshold_lower=0.5,
    ),
}


def _run(name: str, steps: int, noise: float, seed: int, out: Path) -> dict[str, Any]:
    correction = CORRECTIONS[name]
    config = TrainerConfig(
        backend="local",
        workers_per_role=1,
        seed=seed,
        steps=steps,
        val_every=25,
        save_every=steps,
        output_dir=str(out),
        rollout_correction=correction,
    )
    if name != "clean":
        _perturb(noise)
    try:
        result = TaskRunner(config).run()
    finally:
        _restore()
    last = [r for r in result.history if "train/reward" in r][-1]
    return {
        "val_reward": {
            str(r["step"]): round(r["val/reward"], 3) for r in result.history if "val/reward" in r
        },
        "last_step": {
            k: last[k]
            for k in sorted(last)
            if k.startswith(("rollout_corr/", "rollout/log_prob")) or k == "train/reward"
        },
        "seconds": round(result.seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--noise", type=float, default=2.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "perturbed_sampler.json"
    )
    args = parser.parse_args(argv)
    runs: dict[str, dict[str, Any]] = {name: {} for name in CORRECTIONS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name in CORRECTIONS:
                run = _run(name, args.steps, args.noise, seed, Path(tmp) / f"{name}-{seed}")
                runs[name][str(seed)] = run
                print(name, seed, run["val_reward"])
    write_result(
        args.out,
        {
            "date": dt.date.today().isoformat(),
            "machine": machine(),
            "steps": args.steps,
            "noise": args.noise,
            "seeds": args.seeds,
            "runs": runs,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
