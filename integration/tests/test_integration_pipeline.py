"""Pipeline parallelism in the trainer, on Ray: the actor trains on two pipeline stages, its
weights sync to a separately placed rollout group that is tensor parallel over two ranks, and
the rollout then holds the actor's parameters bit for bit and samples the same greedy tokens
as the actor (which samples through its stages)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from sc_dispatch import Dispatch, register
from sc_integration import TaskRunner, make_launcher
from sc_integration._roles import Role
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


def test_pipelined_actor_syncs_to_a_tensor_parallel_rollout(
    ray_cluster: None, tmp_path: Path
) -> None:
    from _integration_runs import tiny_config

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
            sync = trainer._weight_sync
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
            val = trainer._prompt_batch(trainer.task.val_strings[:8], "v", {"do_sample": False})
            mine = rollout.generate_sequences(val)
            theirs = actor.generate_sequences(val)
            assert mine.meta_info["weight_version"] == version
            assert torch.equal(mine.batch["responses"], theirs.batch["responses"])
            assert torch.equal(mine.batch["response_mask"], theirs.batch["response_mask"])
        finally:
            trainer.close()
