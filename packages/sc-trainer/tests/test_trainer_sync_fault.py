"""Weight sync when a rollout rank dies in the middle of it, on Ray: the typed error comes
within seconds, the surviving rollout rank keeps generating with the old version, and after
the dead rank is replaced (``replace_ranks`` + ``init_model``) the next sync succeeds."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from sc_dispatch import Dispatch, register
from sc_trainer import Role, TaskRunner, make_launcher
from sc_workers import RolloutWorker, WeightSync, WeightSyncError

pytestmark = [pytest.mark.fault_matrix, pytest.mark.timeout(300)]


class DyingRollout(RolloutWorker):
    """A rollout worker whose rank 1 exits as soon as the next sync reaches it, once armed
    (the test's fault; the library has no such path)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def arm(self) -> None:
        self._die_in_sync = self.rank == 1

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_receive(
        self, plan: Any, version: int, base: int | None = None, delta: bool = False
    ) -> tuple[int, int]:
        if getattr(self, "_die_in_sync", False):
            os._exit(1)  # the trainer ranks are sending to this rank now
        return super().sync_receive(plan, version, base, delta)


class Runner(TaskRunner):
    def role_worker_mapping(self) -> dict[Role, type]:
        mapping = super().role_worker_mapping()
        mapping[Role.Rollout] = DyingRollout
        return mapping


def test_a_rollout_rank_killed_mid_sync(ray_cluster: None, tmp_path: Path) -> None:
    # Imported here: Ray's workers import this module for DyingRollout, and the test helpers
    # are on the driver's sys.path only.
    from _trainer_runs import tiny_config, val_prompts

    config = tiny_config(tmp_path, workers_per_role=2, placement="separate", rollout_tp=1)
    runner = Runner(config)
    with make_launcher(config).running():
        trainer = runner.build_trainer(make_launcher(config))
        trainer.init_workers()
        try:
            actor = trainer.actor_rollout_wg
            rollout: Any = trainer.rollout_wg  # a group of DyingRollout
            assert rollout is not None
            sync = WeightSync(actor, rollout, timeout_s=60)
            assert sync.sync() == 1
            val = val_prompts(trainer, 8)
            before = rollout.execute_rank_zero_sync("generate_sequences", val)
            assert before.meta_info["weight_version"] == 1

            rollout.arm()
            start = time.monotonic()
            with pytest.raises(WeightSyncError) as failed:
                sync.sync()
            took = time.monotonic() - start
            assert took < 20, took
            assert failed.value.version == 2
            assert failed.value.rank == 1, failed.value
            assert failed.value.group == "rollout", failed.value
            assert "on rollout rank 1" in str(failed.value)
            assert sync.version == 1
            # the survivor (a replica of its own) still serves version 1, unchanged
            survivor = rollout.execute_rank_zero_sync("generate_sequences", val)
            assert survivor.meta_info["weight_version"] == 1
            assert torch.equal(survivor.batch["responses"], before.batch["responses"])

            assert rollout.replace_ranks() == [1]
            rollout.init_model()
            assert sync.sync() == 3  # version 2 was used up by the failed sync
            mine = rollout.generate_sequences(val)
            theirs = actor.generate_sequences(val)
            assert mine.meta_info["weight_version"] == 3
            assert mine.batch is not None
            assert theirs.batch is not None
            assert torch.equal(mine.batch["responses"], theirs.batch["responses"])
            sync.close()
        finally:
            trainer.close()
