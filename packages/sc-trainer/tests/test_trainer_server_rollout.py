"""The trainer generating on engine servers (``rollout_engine="builtin"``): sc-workers'
built-in engine in a server process owned by a Ray actor, fed the actor's weights after
every update; synchronously, and with partial rollout (``async_staleness=1``: the next
step's generation runs across this step's weight push). The vLLM engine runs the same path
in the vllm session (test_integration_vllm_training)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _trainer_runs import assert_same_metrics, run
from sc_trainer import TrainerConfig, TrainerConfigError

pytestmark = pytest.mark.timeout(300)


def _config(tmp_path: Path, **overrides: object) -> TrainerConfig:
    settings: dict[str, object] = {
        "rollout_engine": "builtin",
        "steps": 6,
        "prompts_per_step": 8,
        "responses_per_prompt": 2,
        "workers_per_role": 1,
        "val_every": 3,
        "save_every": 6,
        "output_dir": str(tmp_path / "run"),
    }
    settings.update(overrides)
    return TrainerConfig(**settings)  # type: ignore[arg-type]


def test_the_servers_sample_each_step_with_the_weights_of_the_update_before(
    tmp_path: Path,
) -> None:
    result = run(_config(tmp_path, steps=3, save_every=3))
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert [r["rollout/weight_version"] for r in steps] == [0, 1, 2]
    assert [r["sync/weight_version"] for r in steps] == [1, 2, 3]
    # the publisher keeps the last two versions on disk
    assert sorted(p.name for p in (tmp_path / "run" / "weights").iterdir()) == ["v2", "v3"]
    assert (tmp_path / "run" / "model" / "config.json").is_file(), "the tiny GPT-2 it built"


@pytest.mark.extended
def test_a_server_rollout_run_is_reproducible(tmp_path: Path) -> None:
    """The requests of step s are named s<step>-<row>, which seeds their sampling."""
    first = run(_config(tmp_path / "a", steps=3, val_every=3, save_every=3))
    second = run(_config(tmp_path / "b", steps=3, val_every=3, save_every=3))
    assert_same_metrics(first.history, second.history)


@pytest.mark.extended
def test_partial_rollout_keeps_every_batch_within_the_staleness_bound(tmp_path: Path) -> None:
    result = run(_config(tmp_path, async_staleness=1))
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["step"] for r in steps] == list(range(1, 7))
    assert steps[0]["rollout/staleness"] == 0, "the first batch is generated when it is taken"
    for record in steps[1:]:
        # generated from the start of the step before, across that step's push
        assert 0 <= record["rollout/staleness"] <= 1, record
        assert record["rollout/weight_version"] >= record["step"] - 2
    assert all(r["rollout/regenerated_rows"] == 0 for r in steps)
    assert result.final_step == 6


def test_server_rollout_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    with pytest.raises(TrainerConfigError, match="placement must stay 'colocated'"):
        _config(tmp_path, placement="separate")
    with pytest.raises(TrainerConfigError, match="needs backend='ray'"):
        _config(tmp_path, backend="local")
    with pytest.raises(TrainerConfigError, match="rollout_servers must be"):
        _config(tmp_path, rollout_servers=0)


def test_on_a_gpu_run_each_server_asks_for_a_gpu_of_its_own() -> None:
    from sc_trainer.rollout._fleet_ray import cpu_pool, gpu_pool

    resources = dict(gpu_pool(2, "gpu_fleet_").actor_resources())
    assert resources.get("num_gpus") == 1
    assert not dict(cpu_pool(2, "cpu_fleet_", 1.0).actor_resources()).get("num_gpus")
