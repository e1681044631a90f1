"""The trainer on Ray: PPO and GRPO runs, resume, colocation, and agreement with local.

All tests of this module share one Ray cluster of 4 CPUs; each run stops its workers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from _trainer_runs import (
    assert_finite_training_metrics,
    assert_same_metrics,
    run,
    tiny_config,
)
from sc_trainer import RunResult, TaskRunner
from sc_trainer.runs import CheckpointMismatchError, read_metrics

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ppo_dp2(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """PPO, two dp workers per role, critic colocated: 4 steps, checkpoints at 2 and 4."""
    return run(tiny_config(tmp_path_factory.mktemp("ppo_dp2"), workers_per_role=2))


@pytest.fixture(scope="module")
def ppo_dp1(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return run(tiny_config(tmp_path_factory.mktemp("ppo_dp1")))


def test_ppo_run_has_finite_losses_and_all_metrics(ppo_dp2: RunResult) -> None:
    history = read_metrics(ppo_dp2.output.metrics_path)
    assert [r["step"] for r in history] == [0, 1, 2, 3, 4]
    assert_finite_training_metrics(history, critic=True)
    for record in history[1:]:
        assert record["balance/max_over_mean_tokens"] >= 1.0
        for stage in (
            "generate",
            "reward",
            "old_log_prob",
            "ref_log_prob",
            "values",
            "advantages",
            "update_critic",
            "update_actor",
        ):
            assert record[f"timing/{stage}"] >= 0.0
    assert [r["step"] for r in history if "val/reward" in r] == [0, 2, 4]
    assert ppo_dp2.final_step == 4
    assert ppo_dp2.checkpoint == ppo_dp2.output.checkpoint_dir(4)
    assert (ppo_dp2.output.checkpoint_dir(2) / "trainer_state.json").is_file()
    assert ppo_dp2.output.plot_path.is_file()
    assert ppo_dp2.output.trace_path.is_file()


def test_grpo_run_has_finite_losses_and_no_critic(ray_cluster: None, tmp_path: Path) -> None:
    result = run(tiny_config(tmp_path, algorithm="grpo", workers_per_role=2, steps=2))
    history = read_metrics(result.output.metrics_path)
    assert_finite_training_metrics(history, critic=False)
    assert not any(k.startswith("critic/") for r in history for k in r)
    assert not (result.checkpoint / "critic").exists()


def test_resume_equals_the_uninterrupted_run(ppo_dp2: RunResult, tmp_path: Path) -> None:
    cfg = tiny_config(
        tmp_path, workers_per_role=2, resume_from=str(ppo_dp2.output.checkpoint_dir(2))
    )
    resumed = run(cfg)
    assert resumed.final_step == 4
    assert_same_metrics(
        read_metrics(resumed.output.metrics_path), read_metrics(ppo_dp2.output.metrics_path)
    )


def test_resume_refuses_a_checkpoint_of_another_shape(ppo_dp2: RunResult, tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, workers_per_role=1, resume_from=str(ppo_dp2.output.root))
    with pytest.raises(CheckpointMismatchError, match="workers_per_role: checkpoint 2, this run 1"):
        TaskRunner(cfg).run()
    done = tiny_config(tmp_path, workers_per_role=2, resume_from=str(ppo_dp2.output.root))
    with pytest.raises(CheckpointMismatchError, match="at step 4"):
        TaskRunner(done).run()


def test_local_backend_agrees_with_ray_at_world_size_1(ppo_dp1: RunResult, tmp_path: Path) -> None:
    local = run(tiny_config(tmp_path, backend="local"))
    assert_same_metrics(
        read_metrics(local.output.metrics_path), read_metrics(ppo_dp1.output.metrics_path)
    )


def _tp_config() -> Any:
    from sc_workers import (
        ActorConfig,
        ActorRolloutRefConfig,
        MegatronConfig,
        ModelConfig,
        RefConfig,
        RolloutConfig,
    )

    megatron = MegatronConfig(tensor_model_parallel_size=2)
    return ActorRolloutRefConfig(
        model=ModelConfig(vocab_size=16, hidden_size=32, num_attention_heads=4),
        actor=ActorConfig(
            strategy="megatron",
            megatron=megatron,
            ppo_mini_batch_size=4,
            ppo_micro_batch_size_per_gpu=2,
        ),
        rollout=RolloutConfig(response_length=3, log_prob_micro_batch_size_per_gpu=2),
        ref=RefConfig(strategy="megatron", megatron=megatron),
        device="cpu",
    )


@pytest.mark.extended
def test_tp2_dp2_actor_mesh_returns_one_row_per_input_row(ray_cluster: None) -> None:
    from sc_protocol import DataProto
    from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from sc_workers import ActorRolloutRefWorker

    pool = RayResourcePool(process_on_nodes=[4], use_gpu=False)
    cls = RayClassWithInitArgs(
        ray.remote(ActorRolloutRefWorker), config=_tp_config(), role="actor_rollout_ref"
    )
    with RayWorkerGroup(
        resource_pool=pool, ray_cls_with_init=cls, worker_env={"OMP_NUM_THREADS": "1"}
    ) as wg:
        wg.init_model()
        rows = 6
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(3, 16, (rows, 4), generator=gen)
        batch = DataProto.from_dict(
            tensors={
                "input_ids": prompts,
                "attention_mask": torch.ones_like(prompts),
                "position_ids": torch.arange(4).expand(rows, 4).clone(),
            }
        )
        out = wg.generate_sequences(batch)
        assert len(out) == rows
        assert out.batch["responses"].shape == (rows, 3)
        log_probs = wg.compute_log_prob(out)
        assert log_probs.batch["old_log_probs"].shape == (rows, 3)
        assert torch.isfinite(log_probs.batch["old_log_probs"]).all()
        assert wg._mesh_cache.layouts()["actor"].dp_ranks == (0, 0, 1, 1)
