"""The trainer on the tool task (``task.mode="tool-calc"``): multi-turn agent sessions on the
built-in engine's servers, trained end to end. The engine's log-probs of the model tokens
equal the actor's recomputation over the whole multi-turn sequence (tool tokens included as
context); with a staleness bound the extra groups feed the next step within it; what the
tool task refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from _trainer_runs import run
from sc_trainer import TaskConfig, TrainerConfig, TrainerConfigError

pytestmark = pytest.mark.timeout(300)


def _config(tmp_path: Path, **overrides: object) -> TrainerConfig:
    settings: dict[str, object] = {
        "task": TaskConfig(mode="tool-calc"),
        "rollout_engine": "builtin",
        "steps": 4,
        "prompts_per_step": 8,
        "responses_per_prompt": 2,
        "workers_per_role": 1,
        "val_every": 4,
        "save_every": 4,
        "agent_extra_groups": 2,
        "output_dir": str(tmp_path / "run"),
    }
    settings.update(overrides)
    return TrainerConfig(**settings)  # type: ignore[arg-type]


def test_tool_sessions_train_with_the_engines_tokens_and_log_probs(tmp_path: Path) -> None:
    result = run(_config(tmp_path, steps=2, val_every=2, save_every=2))
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        assert record["agent/sessions"] == 16
        assert record["agent/dropped"] == 0
        assert record["rollout/staleness"] == 0
        assert record["rollout/weight_version"] == record["step"] - 1
        # multi-turn token parity inside training: the actor's log-probs of the model tokens,
        # over prompt + turns + tool tokens, are the engine's
        assert record["rollout/log_prob_diff_max"] < 1e-4, record
    # 3 in 4 sessions are hints (tool tokens in context from the start), not counted as calls
    assert all(0.0 <= r["agent/tool_call_rate"] <= 0.5 for r in steps), steps
    # the scores reach the batch (a run whose rewards were lost would train on zeros) and
    # the result reports the last validation
    assert any(r["train/reward"] > 0.0 for r in steps), steps
    assert result.last_val_reward == result.history[-1]["val/reward"]
    assert (tmp_path / "run" / "model" / "tokenizer.json").is_file()


@pytest.mark.extended
def test_with_a_staleness_bound_every_batch_stays_within_it(tmp_path: Path) -> None:
    result = run(_config(tmp_path, async_staleness=1, agent_extra_groups=4))
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(0 <= r["rollout/staleness"] <= 1 for r in steps), steps
    assert "rollout/log_prob_diff_max" not in steps[0]  # off-policy: the engine's log-probs


def test_the_tool_task_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    with pytest.raises(TrainerConfigError, match="rollout_engine must be 'builtin' or 'vllm'"):
        _config(tmp_path, rollout_engine="workers")
    with pytest.raises(TrainerConfigError, match="agent_extra_groups must be >= 0, got -1"):
        _config(tmp_path, agent_extra_groups=-1)
    with pytest.raises(TrainerConfigError, match="agent_deadline_s must be > 0, got 0"):
        _config(tmp_path, agent_deadline_s=0)
