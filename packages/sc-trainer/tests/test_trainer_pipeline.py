"""Pipeline parallelism in the trainer, on Ray: the actor trains on two pipeline stages, its
weights sync to a separately placed rollout group that is tensor parallel over two ranks, and
the rollout then holds the actor's parameters bit for bit and samples the same greedy tokens
as the actor (which samples through its stages)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from sc_core import WorkerError
from sc_dispatch import Dispatch, register
from sc_trainer import Role, TaskRunner, make_launcher
from sc_workers import ActorRolloutRefWorker, RolloutWorker
from torch.distributed.tensor import DTensor

pytestmark = pytest.mark.timeout(300)


def _full(engine: Any) -> dict[str, torch.Tensor]:
    out = {}
    for name, param in engine.module.named_parameters():
        full = param.full_tensor() if isinstance(param, DTensor) else param
        out[name] = full.detach().cpu().clone()
    return out


class Actor(ActorRolloutRefWorker):
    """The actor, with a way to read its (this stage's) full parameters."""

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def full_parameters(self) -> dict[str, torch.Tensor]:
        return _full(self.actor_engine)


class Rollout(RolloutWorker):
    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def full_parameters(self) -> dict[str, torch.Tensor]:
        return _full(self.rollout_engine)


class Runner(TaskRunner):
    def role_worker_mapping(self) -> dict[Role, type]:
        mapping = super().role_worker_mapping()
        mapping[Role.ActorRolloutRef] = Actor
        mapping[Role.Rollout] = Rollout
        return mapping


@pytest.mark.extended
def test_pipelined_actor_syncs_to_a_tensor_parallel_rollout(
    ray_cluster: None, tmp_path: Path
) -> None:
    from _trainer_runs import tiny_config, val_prompts, weight_sync

    config = tiny_config(
        tmp_path,
        workers_per_role=2,
        actor_pp=2,
        placement="separate",
        rollout_tp=2,
        steps=2,
        val_every=2,
        save_every=2,
    )
    runner = Runner(config)
    with make_launcher(config).running():
        trainer = runner.build_trainer(make_launcher(config))
        trainer.init_workers()
        try:
            trainer.fit()
            sync = weight_sync(trainer)
            assert sync is not None
            version = sync.sync()  # the weights of the last update
            actor: Any = trainer.actor_rollout_wg
            rollout: Any = trainer.rollout_wg
            stages = actor.full_parameters()
            # each stage holds its own layers: together, the whole model, once each
            assert not set(stages[0]) & set(stages[1])
            trained = {**stages[0], **stages[1]}
            assert any(".layers.0." in n or n.startswith("layers.0.") for n in stages[0])
            assert "lm_head.weight" in stages[1]
            for ranks in rollout.full_parameters():  # every tp rank's view of the full model
                assert ranks.keys() == trained.keys()
                for name, value in trained.items():
                    assert torch.equal(ranks[name], value), name
            val = val_prompts(trainer, 8)
            mine = rollout.generate_sequences(val)
            theirs = actor.generate_sequences(val)
            assert mine.meta_info["weight_version"] == version
            assert torch.equal(mine.batch["responses"], theirs.batch["responses"])
            assert torch.equal(mine.batch["response_mask"], theirs.batch["response_mask"])
            _a_stage_that_raises_does_not_hang_the_driver(trainer, actor)
        finally:
            trainer.close()


def _a_stage_that_raises_does_not_hang_the_driver(trainer: Any, actor: Any) -> None:
    """An update whose batch has a response token outside the vocabulary: the last stage
    fails inside the 1F1B schedule while the first waits for its gradients. The driver gets
    the failing stage's error within seconds (not its peer's, nor after the 300 s pipeline
    timeout), no rank is left blocked, and the next call rebuilds the pipeline's groups: the
    same batch fails again with its own error, a valid one is computed."""
    from _trainer_runs import val_prompts

    batch = val_prompts(trainer, 16)
    out = actor.generate_sequences(batch)
    rows, length = out.batch["responses"].shape
    zeros = torch.zeros(rows, length)
    out.batch["old_log_probs"] = zeros
    out.batch["advantages"] = zeros
    out.batch["ref_log_prob"] = zeros
    out.batch["responses"][0, 0] = 10_000
    start = time.monotonic()
    with pytest.raises(WorkerError) as failed:
        actor.update_actor(out)
    assert time.monotonic() - start < 60
    assert "PipelineStageError" in str(failed.value)
    assert "(pipeline stage 1 of 2): train_step failed" in str(failed.value)
    # the first stage's part of the call ends too (its peer's teardown closed its wait)
    deadline = time.monotonic() + 30
    while actor.busy_ranks and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not actor.busy_ranks
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"\(pipeline stage 1 of 2\): forward_only failed"):
        actor.compute_log_prob(out)
    assert time.monotonic() - start < 60
    deadline = time.monotonic() + 30
    while actor.busy_ranks and time.monotonic() < deadline:
        time.sleep(0.2)
    out.batch["responses"][0, 0] = 0  # a token of the vocabulary again
    again = actor.compute_log_prob(out)  # on the groups rebuilt after the failure
    assert again.batch["old_log_probs"].shape == (rows, length)
    assert torch.isfinite(again.batch["old_log_probs"]).all()


def test_pipeline_and_sequence_parallel_config_errors(tmp_path: Path) -> None:
    from _trainer_runs import tiny_config
    from sc_trainer import TrainerConfigError
    from sc_trainer.cli import build_parser, config_from_args

    with pytest.raises(TrainerConfigError, match=r"actor_pp must be >= 1, got 0"):
        tiny_config(tmp_path, actor_pp=0)
    with pytest.raises(
        TrainerConfigError, match=r"actor_pp \(2\) must divide workers_per_role \(3\)"
    ):
        tiny_config(tmp_path, workers_per_role=3, actor_pp=2)
    with pytest.raises(TrainerConfigError, match=r"sp \(2\) must divide workers_per_role \(3\)"):
        tiny_config(tmp_path, workers_per_role=3, sp=2)
    with pytest.raises(TrainerConfigError, match=r"actor_pp=2 and sp=2: .* pick one"):
        tiny_config(tmp_path, workers_per_role=4, actor_pp=2, sp=2)
    with pytest.raises(TrainerConfigError, match=r"actor_pp=4 stages need at least as many"):
        tiny_config(tmp_path, workers_per_role=4, actor_pp=4)
    with pytest.raises(TrainerConfigError, match=r"the in-process backend .* use backend='ray'"):
        tiny_config(tmp_path, backend="local", workers_per_role=1, actor_pp=2)
    config = config_from_args(build_parser().parse_args(["--actor-pp", "2"]))
    assert (config.actor_pp, config.sp) == (2, 1)
    config = config_from_args(build_parser().parse_args(["--sp", "2"]))
    assert (config.actor_pp, config.sp) == (1, 2)
