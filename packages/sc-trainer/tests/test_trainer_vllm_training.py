"""A short PPO run (60 steps) with vLLM generating (the ``extended`` nox session, which makes
vLLM's environment first; marked ``vllm`` and ``extended``).

The trainer's rollout runs on one vLLM server placed by Ray (``rollout_engine="vllm"``) and
gets the actor's weights after every update; the model is the tiny GPT-2 the runner builds.
The run must improve its validation reward (greedy answers to held-out prompts, generated
by vLLM too), and every step's batch must have been sampled by the weights of the step
before (the push is synchronous).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _trainer_runs import run
from sc_trainer import TrainerConfig

pytestmark = [pytest.mark.vllm, pytest.mark.extended, pytest.mark.timeout(900)]


def test_a_short_ppo_run_with_vllm_rollout_improves_validation_reward(tmp_path: Path) -> None:
    config = TrainerConfig(
        rollout_engine="vllm",
        steps=60,
        val_every=30,
        save_every=60,
        workers_per_role=1,
        output_dir=str(tmp_path / "run"),
    )
    result = run(config)
    assert result.final_step == 60
    assert result.last_val_reward > result.first_val_reward + 0.1, (
        result.first_val_reward,
        result.last_val_reward,
    )
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["rollout/weight_version"] for r in steps] == list(range(60))
    assert all(r["sync/weight_version"] == r["step"] for r in steps)
    assert (tmp_path / "run" / "model" / "config.json").is_file()
    kept = sorted(p.name for p in (tmp_path / "run" / "weights").iterdir())
    assert kept == ["v59", "v60"]
