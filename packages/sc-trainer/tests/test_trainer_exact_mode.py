"""The exact mode in the trainer (``exact_window``): over several steps of the demo's task, the
sampler's log-probs equal the actor's bit for bit and the first PPO ratio of every step is
exactly 1, on the worker groups' sampler and on the built-in engine's servers; without the mode
the same runs show the difference it removes. ``exact_check`` stops a run at the first token
that differs, naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _trainer_runs import run, tiny_config
from sc_protocol import DataProto
from sc_trainer import TrainerConfigError
from sc_trainer.trainer import ExactModeMismatchError, check_exact

pytestmark = pytest.mark.timeout(600)

WINDOW = 16  # the digit task's prompt (5 tokens) and response (4) with room to spare


def _steps(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in history if "train/reward" in r]


@pytest.mark.parametrize(
    "rollout_engine",
    # the engine alone is checked bit for bit in sc-workers' default tests
    ["workers", pytest.param("builtin", marks=pytest.mark.extended)],
)
def test_the_sampler_and_the_actor_agree_bit_for_bit_at_every_step(
    tmp_path: Path, rollout_engine: str
) -> None:
    settings: dict[str, Any] = {
        "rollout_engine": rollout_engine,
        "steps": 3,
        "temperature": 0.9,
        "ppo_mini_batches": 2,
    }
    if rollout_engine == "workers":
        settings.update(backend="ray", workers_per_role=2)
    exact = run(tiny_config(tmp_path / "exact", exact_window=WINDOW, exact_check=True, **settings))
    steps = _steps(exact.history)
    assert [r["step"] for r in steps] == [1, 2, 3]
    for record in steps:
        assert record["rollout/log_prob_diff_max"] == 0.0, record
        assert record["rollout_corr/k3_kl"] == 0.0, record
        assert record["actor/ppo_ratio_first_dev_max"] == 0.0, record
    plain = _steps(run(tiny_config(tmp_path / "plain", **settings)).history)
    assert max(r["rollout/log_prob_diff_max"] for r in plain) > 0.0, plain


def test_the_check_names_the_first_token_that_differs() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    sampled = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.25, -3.0]])
    actor = sampled.clone()
    actor[0, 2] = -9.0  # past the mask: not compared
    batch = DataProto.from_dict(
        tensors={
            "rollout_log_probs": sampled,
            "old_log_probs": actor,
            "response_mask": mask,
            "responses": torch.tensor([[4, 5, 0], [6, 7, 8]]),
        }
    )
    check_exact(batch, 3)
    actor[1, 1] = -0.25000003
    actor[1, 2] = -3.5
    with pytest.raises(
        ExactModeMismatchError,
        match=r"step 3: response token 1 of row 1 \(token id 7\) was sampled with log-prob "
        r"-0\.25, the actor computes -0\.25000\d+ .*2 of 5 response tokens differ",
    ):
        check_exact(batch, 3)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"exact_window": -1}, "exact_window must be an int >= 0, got -1"),
        ({"exact_window": True}, "exact_window must be an int >= 0, got True"),
        (
            {"exact_window": 16, "rollout_engine": "vllm", "backend": "ray"},
            "vLLM has none here",
        ),
        ({"exact_check": True}, "set exact_window too"),
        (
            {
                "exact_window": 16,
                "exact_check": True,
                "async_staleness": 1,
                "placement": "separate",
            },
            "with async_staleness=1 they come from older weights",
        ),
    ],
)
def test_bad_exact_settings_are_config_errors(
    tmp_path: Path, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(TrainerConfigError, match=message):
        tiny_config(tmp_path, **settings)
