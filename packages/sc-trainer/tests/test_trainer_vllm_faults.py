"""Recovery in place with vLLM engine servers (the ``faults`` nox session, which makes vLLM's
environment first; marked ``vllm`` and ``fault_matrix``).

One step loses both an actor rank and the vLLM server: the router restarts the server and
syncs it, recovery in place restores the step-2 checkpoint and pushes those weights to the
server under the next push version (the server's versions only grow), and the run goes on.
vLLM seeds each request's sampling with the request's seed (named by step and row), so the
replayed steps sample what the uninterrupted run sampled: the run ends with the same history
(every step recorded once, the same rewards and validation reward) as the run without a fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _trainer_runs import run
from sc_trainer import TrainerConfig
from sc_trainer.testing import metric_differences

pytestmark = [pytest.mark.vllm, pytest.mark.fault_matrix, pytest.mark.timeout(1200)]


def _config(tmp_path: Path, **overrides: Any) -> TrainerConfig:
    return TrainerConfig(
        rollout_engine="vllm",
        algorithm="grpo",
        steps=4,
        save_every=2,
        val_every=4,
        max_recoveries=2,
        background_checkpoints=False,
        workers_per_role=1,
        output_dir=str(tmp_path / "run"),
        **overrides,
    )


def test_a_dead_worker_and_a_dead_vllm_server_in_one_step(tmp_path: Path) -> None:
    clean = run(_config(tmp_path / "clean"))
    faulty = run(_config(tmp_path / "faulty", inject_fault="actor:0@step=3,server:0@step=3"))
    steps = [r["step"] for r in faulty.history]
    assert steps == sorted(set(steps)), f"a step was recorded twice: {steps}"
    assert faulty.final_step == clean.final_step == 4
    recovered = [r for r in faulty.history if "recovery/count" in r]
    assert [r["recovery/from_step"] for r in recovered] == [2]
    without = [
        {k: v for k, v in r.items() if not k.startswith("recovery/")} for r in faulty.history
    ]
    assert metric_differences(without, clean.history) == []
    assert faulty.last_val_reward == clean.last_val_reward
