"""Test support for code built on the trainer: runs of a few seconds, and comparisons of two
runs (what sc's own trainer tests use; not needed to train).

:func:`tiny_config` is a :class:`~sc_trainer.TrainerConfig` whose steps take a fraction of a
second on one CPU; :func:`final_weights` reads every model tensor of a checkpoint, so two
runs can be compared bit for bit; :func:`metric_differences` compares two runs' metrics
step by step, leaving out the wall-time entries (:func:`deterministic`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from sc_dispatch import _public

from .config import TaskConfig, TrainerConfig
from .trainer import TIMING_PREFIXES

__all__ = ["deterministic", "final_weights", "metric_differences", "tiny_config"]


def tiny_config(output_dir: str | Path, **overrides: Any) -> TrainerConfig:
    """A run of a few seconds: 4 steps of 8 prompts x 2 responses on one worker per role,
    3-digit prompts (16 held out), a model of width 32; ``overrides`` replace any field."""
    settings: dict[str, Any] = {
        "steps": 4,
        "prompts_per_step": 8,
        "responses_per_prompt": 2,
        "workers_per_role": 1,
        "hidden_size": 32,
        "val_every": 2,
        "save_every": 2,
        "output_dir": str(output_dir),
        "task": TaskConfig(length=3, num_val=16),
    }
    settings.update(overrides)
    return TrainerConfig(**settings)


def final_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every model tensor of the checkpoint in ``folder``, keyed by file and name."""
    out = {}
    for path in sorted(Path(folder).rglob("*.pt")):
        state = torch.load(path, weights_only=True)
        for key, tensor in state["model"].items():
            out[f"{path.relative_to(folder)}:{key}"] = tensor
    return out


def deterministic(record: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics record without its wall-time entries (``timing/*``, ``perf/*``)."""
    return {k: v for k, v in record.items() if not k.startswith(TIMING_PREFIXES)}


def metric_differences(
    a: Sequence[Mapping[str, Any]],
    b: Sequence[Mapping[str, Any]],
    *,
    rel_tol: float = 1e-5,
    abs_tol: float = 1e-6,
) -> list[str]:
    """Where two runs' metrics differ, step by step and key by key (floats within the
    tolerances are equal; wall-time entries are left out); empty when they agree."""
    steps_a, steps_b = [r.get("step") for r in a], [r.get("step") for r in b]
    if steps_a != steps_b:
        return [f"steps differ: {steps_a} != {steps_b}"]
    found: list[str] = []
    for ra, rb in zip(a, b, strict=True):
        da, db = deterministic(ra), deterministic(rb)
        step = ra.get("step")
        if da.keys() != db.keys():
            found.append(f"step {step}: keys differ: {sorted(da.keys() ^ db.keys())}")
            continue
        for key, va in da.items():
            vb = db[key]
            if isinstance(va, float) or isinstance(vb, float):
                same = math.isclose(va, vb, rel_tol=rel_tol, abs_tol=abs_tol)
            else:
                same = va == vb
            if not same:
                found.append(f"step {step}: {key}: {va!r} != {vb!r}")
    return found


_public.publish(globals())
