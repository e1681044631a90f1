"""Helpers shared by sc-trainer's tests: a run, and checks of its metrics; agent sessions run
on a toy engine."""

from __future__ import annotations

import math
from typing import Any

from sc_protocol import DataProto
from sc_rollout import AgentLoop, AgentLoopConfig, AgentOutcome, AgentTask, SamplingParams
from sc_rollout.testing import ToyEngine, ToyEngineConfig
from sc_trainer import RayPPOTrainer, RunResult, TaskRunner, TrainerConfig
from sc_trainer.rollout import AsyncRollout, WorkerGroupRollout
from sc_trainer.tasks import DigitsTask, TaskPrompts
from sc_trainer.testing import deterministic, final_weights, metric_differences, tiny_config
from sc_workers import WeightSync

__all__ = [
    "agent_outcomes",
    "assert_finite_training_metrics",
    "assert_same_metrics",
    "deterministic",
    "final_weights",
    "run",
    "tiny_config",
    "val_prompts",
    "weight_sync",
]


def run(config: TrainerConfig) -> RunResult:
    return TaskRunner(config).run()


def agent_outcomes(
    agent: Any, tasks: list[AgentTask], *, max_tokens: int, engine: Any = None
) -> list[AgentOutcome]:
    """Every session of ``tasks`` run by ``agent`` (on a toy engine of 16 tokens unless
    ``engine``), in submission order (groups come back in the order they end)."""
    engine = engine or ToyEngine(ToyEngineConfig(vocab_size=16))
    config = AgentLoopConfig(16, 10.0, SamplingParams(max_tokens=max_tokens, seed=5))
    with AgentLoop(engine, agent, config=config) as loop:
        loop.submit(tasks)
        outcomes = [o for group in loop.take_all(timeout=20) for o in group]
    order = {task.session_id: i for i, task in enumerate(tasks)}
    return sorted(outcomes, key=lambda o: order[o.task.session_id])


def assert_same_metrics(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    """Two runs' metrics agree step by step, key by key (within float tolerance)."""
    differences = metric_differences(a, b)
    assert not differences, differences[:10]


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


def val_prompts(trainer: RayPPOTrainer, rows: int) -> DataProto:
    """The first ``rows`` held-out prompts of ``trainer``'s digit task, for greedy answers."""
    task = trainer.task
    assert isinstance(task, DigitsTask), type(task)
    return TaskPrompts(task, 1, 1, 0).batch(task.val_strings[:rows], "v", {"do_sample": False})


def weight_sync(trainer: RayPPOTrainer) -> WeightSync:
    """The weight sync of ``trainer``'s separately placed rollout (after ``init_workers``)."""
    source = trainer.rollout
    assert isinstance(source, (WorkerGroupRollout, AsyncRollout)), type(source)
    assert source.weight_sync is not None
    return source.weight_sync
