"""Helpers shared by the integration tests: tiny trainer configurations and comparisons."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from sc_integration import RunResult, TaskConfig, TaskRunner, TrainerConfig
from sc_integration._trainer import TIMING_PREFIXES


def tiny_config(output_dir: Path, **overrides: Any) -> TrainerConfig:
    """A run of a few seconds per step: short prompts, small batches, a narrow model."""
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
    for path in sorted(folder.rglob("*.pt")):
        state = torch.load(path, weights_only=True)
        for key, tensor in state["model"].items():
            out[f"{path.relative_to(folder)}:{key}"] = tensor
    return out


def run(config: TrainerConfig) -> RunResult:
    return TaskRunner(config).run()


def deterministic(record: dict[str, Any]) -> dict[str, Any]:
    """A metrics record without its wall-time entries."""
    return {k: v for k, v in record.items() if not k.startswith(TIMING_PREFIXES)}


def assert_same_metrics(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    """Two runs' metrics agree step by step, key by key (within float tolerance)."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        da, db = deterministic(ra), deterministic(rb)
        assert da.keys() == db.keys(), (ra["step"], sorted(da.keys() ^ db.keys()))
        for key, va in da.items():
            vb = db[key]
            if isinstance(va, float) or isinstance(vb, float):
                assert math.isclose(va, vb, rel_tol=1e-5, abs_tol=1e-6), (ra["step"], key, va, vb)
            else:
                assert va == vb, (ra["step"], key, va, vb)


def assert_finite_training_metrics(history: list[dict[str, Any]], *, critic: bool) -> None:
    """Every training step has finite rewards and losses (and the critic's, for PPO)."""
    needed = ["train/reward", "actor/pg_loss", "actor/kl_ref", "actor/entropy", "actor/kl_loss"]
    if critic:
        needed += ["critic/vf_loss"]
    steps = [r for r in history if r["step"] > 0]
    assert steps
    for record in steps:
        for key in needed:
            value = record.get(key)
            assert isinstance(value, float), (record["step"], key, value)
            assert math.isfinite(value), (record["step"], key, value)
