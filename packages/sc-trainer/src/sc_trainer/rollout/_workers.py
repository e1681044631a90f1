"""The rollout source on worker groups: the actor's own group samples, or a rollout group of
its own whose weights follow the actor's through a weight sync after every update.

Colocated (the default), the actor, its rollout and the reference model share one process
per rank, so the sampler always holds the actor's current weights. With
``placement="separate"`` a :class:`~sc_workers.RolloutWorker` group (tensor parallel over
``rollout_tp`` of its ranks) samples, and :class:`~sc_workers.WeightSync` brings it the
actor's weights after each update, rank to rank, before the next generation.
"""

from __future__ import annotations

from typing import Any

from sc_core import WorkerGroup
from sc_protocol import DataProto
from sc_workers import ActorRolloutRefWorker, RolloutWorker, WeightSync

from ._source import PromptSource, RolloutSnapshot, Stage

__all__ = ["WorkerGroupRollout", "padded_to"]


def padded_to(batch: DataProto, multiple: int) -> DataProto:
    """``batch`` with its first rows repeated at the end until its length divides by
    ``multiple`` (the dp size of the group that generates it)."""
    pad = (-len(batch)) % multiple
    return DataProto.concat([batch, batch[:pad]]) if pad else batch


class WorkerGroupRollout:
    """Sampling on ``actor``'s group, or on ``rollout``'s (synced from ``actor`` after every
    update) when given; ``prompts`` makes each step's batch, ``dp_size`` is the sampling
    group's data-parallel size (a validation batch is padded to it)."""

    def __init__(
        self,
        actor: WorkerGroup[ActorRolloutRefWorker],
        prompts: PromptSource,
        dp_size: int,
        rollout: WorkerGroup[RolloutWorker] | None = None,
    ) -> None:
        self.actor = actor
        self.rollout = rollout
        self.prompts = prompts
        self.dp_size = dp_size
        self.weight_sync = None if rollout is None else WeightSync(actor, rollout)

    @property
    def on_policy(self) -> bool:
        """Every batch is sampled with the actor's current weights."""
        return True

    def _generate(self, batch: DataProto) -> DataProto:
        if self.rollout is None:
            return self.actor.generate_sequences(batch)
        return self.rollout.generate_sequences(batch)

    def start(self, version: int) -> None:
        """A separately placed rollout gets the actor's weights over a fresh channel (its
        group may have been re-formed)."""
        if self.weight_sync is not None:
            self.weight_sync.reset()
            self.weight_sync.sync()

    def drop(self) -> None:
        """Nothing is generated ahead of the loop."""

    def take(self, step: int, stage: Stage) -> tuple[DataProto, dict[str, Any]]:
        batch = self.prompts.train_batch(step)
        with stage("generate"):  # prompts in, prompts + responses out (non-tensor columns kept)
            return self._generate(batch), {}

    def after_update(self, step: int, stage: Stage, validates: bool) -> dict[str, Any]:
        if self.weight_sync is None:
            return {}
        with stage("sync_weights"):  # the rollout samples the next step with these weights
            return {"sync/weight_version": self.weight_sync.sync()}

    def validation_batch(self, step: int) -> DataProto:
        prompts = self.prompts.val_batch()
        out = self._generate(padded_to(prompts, self.dp_size))
        return out[: len(prompts)]

    def snapshot(self) -> RolloutSnapshot:
        sync = self.weight_sync
        return RolloutSnapshot(weight_sync_version=None if sync is None else sync.version)

    def restore(self, snapshot: RolloutSnapshot) -> None:
        if self.weight_sync is not None and snapshot.weight_sync_version is not None:
            self.weight_sync.version = snapshot.weight_sync_version

    def close(self, *, detach: bool = False) -> None:
        """Leave the weight-sync channel (a detached run's driver leaves it to the next)."""
        sync, self.weight_sync = self.weight_sync, None
        if sync is not None and not detach:
            sync.close()
