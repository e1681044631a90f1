"""WeightSync between in-process groups (sc-core's LocalWorkerGroup, in-memory channel): the
rollout serves the trainer's weights after a sync, generates what the actor generates, tags
its batches with the version, and keeps its weights when a sync fails."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _workers_helpers import actor_config, col, prompt_batch
from sc_core import ClassWithInitArgs, LocalWorkerGroup, ResourcePool
from sc_workers import (
    ActorRolloutRefWorker,
    RolloutWorker,
    SyncLayoutError,
    WeightSync,
    WeightSyncError,
)
from sc_workers.sync._layout import local_view

pytestmark = pytest.mark.timeout(120)


def _rollout_config(**model: Any) -> Any:
    cfg = actor_config()
    # a different seed: the rollout starts from other weights than the trainer
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, seed=123, **model))


@pytest.fixture
def groups() -> Iterator[tuple[LocalWorkerGroup[Any], LocalWorkerGroup[Any]]]:
    actor = LocalWorkerGroup(
        ResourcePool([1]),
        ClassWithInitArgs(ActorRolloutRefWorker, config=actor_config(), role="actor_rollout"),
    )
    rollout = LocalWorkerGroup(
        ResourcePool([1]), ClassWithInitArgs(RolloutWorker, config=_rollout_config())
    )
    try:
        actor.init_model()
        rollout.init_model()
        yield actor, rollout
    finally:
        actor.close()
        rollout.close()


def _params(group: LocalWorkerGroup[Any], engine_attr: str) -> dict[str, torch.Tensor]:
    worker = group.workers[0]
    module = getattr(worker, engine_attr).module
    return {n: local_view(p).detach().clone() for n, p in module.named_parameters()}


def test_sync_serves_the_trainers_weights_and_generation_matches(
    groups: tuple[LocalWorkerGroup[Any], LocalWorkerGroup[Any]],
) -> None:
    actor, rollout = groups
    before = rollout.generate_sequences(prompt_batch(do_sample=False))
    assert before.meta_info["weight_version"] == 0
    trainer_weights = _params(actor, "actor_engine")
    assert not all(
        torch.equal(trainer_weights[n], t) for n, t in _params(rollout, "rollout_engine").items()
    )
    with WeightSync(actor, rollout) as sync:
        assert sync.sync() == 1
        assert sync.plan is not None
        assert sync.plan.total_bytes == sum(4 * t.numel() for t in trainer_weights.values())
    served = _params(rollout, "rollout_engine")
    assert all(torch.equal(trainer_weights[n], t) for n, t in served.items())
    after = rollout.generate_sequences(prompt_batch(do_sample=False))
    assert after.meta_info["weight_version"] == 1
    own = actor.generate_sequences(prompt_batch(do_sample=False))
    assert torch.equal(col(after, "responses"), col(own, "responses"))


def test_failed_sync_keeps_the_previous_version(
    groups: tuple[LocalWorkerGroup[Any], LocalWorkerGroup[Any]],
) -> None:
    actor, rollout = groups
    # the rollout's receive waits for the failed sender up to the timeout: keep it short
    sync = WeightSync(actor, rollout, timeout_s=1)
    assert sync.sync() == 1
    kept = _params(rollout, "rollout_engine")
    # the trainer's ranks fail while sending: the rollout must not switch
    worker = actor.workers[0]
    original = worker.actor_engine

    class Broken:
        device = original.device
        module = original.module

        def on_device(self) -> Any:
            raise RuntimeError("disk on fire")

    worker.actor_engine = Broken()
    try:
        with pytest.raises(WeightSyncError, match=r"version 2 failed .*disk on fire") as info:
            sync.sync()
        assert info.value.version == 2
    finally:
        worker.actor_engine = original
    assert sync.version == 1
    assert all(torch.equal(kept[n], t) for n, t in _params(rollout, "rollout_engine").items())
    assert (
        rollout.generate_sequences(prompt_batch(do_sample=False)).meta_info["weight_version"] == 1
    )
    # the next sync repairs it, with a newer version number
    assert sync.sync() == 3
    sync.close()


def test_a_later_weight_sync_numbers_after_the_served_version(
    groups: tuple[LocalWorkerGroup[Any], LocalWorkerGroup[Any]],
) -> None:
    actor, rollout = groups
    first = WeightSync(actor, rollout)
    assert [first.sync(), first.sync()] == [1, 2]
    first.close()
    # a driver that re-attaches makes a new WeightSync over the same groups: the rollout
    # serves version 2, so the new one's first version is 3, not a refused 1
    second = WeightSync(actor, rollout)
    assert second.sync() == 3
    assert second.version == 3
    assert rollout.sync_served_version() == [3]
    assert (
        rollout.generate_sequences(prompt_batch(do_sample=False)).meta_info["weight_version"] == 3
    )
    second.close()


def test_unreadable_served_versions_fail_the_sync_naming_the_rollout(
    groups: tuple[LocalWorkerGroup[Any], LocalWorkerGroup[Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    actor, rollout = groups

    def unreachable() -> list[int]:
        raise ConnectionError("rollout host unreachable")

    monkeypatch.setattr(rollout, "sync_served_version", unreachable)
    sync = WeightSync(actor, rollout)
    with pytest.raises(WeightSyncError, match="versions the rollout ranks serve") as info:
        sync.sync()
    assert info.value.group == "rollout"
    assert "ConnectionError: rollout host unreachable" in str(info.value)
    assert sync.version == 0
    sync.close()


def test_shape_mismatch_is_a_typed_error(
    groups: tuple[LocalWorkerGroup[Any], LocalWorkerGroup[Any]],
) -> None:
    actor, _ = groups
    wide = LocalWorkerGroup(
        ResourcePool([1]),
        ClassWithInitArgs(RolloutWorker, config=_rollout_config(intermediate_size=128)),
    )
    try:
        wide.init_model()
        sync = WeightSync(actor, wide, timeout_s=5)
        with pytest.raises(WeightSyncError, match="version 1 failed") as info:
            sync.sync()
        assert isinstance(info.value.__cause__, SyncLayoutError)
        assert "mlp" in str(info.value)
        assert sync.version == 0
        assert (
            wide.generate_sequences(prompt_batch(do_sample=False)).meta_info["weight_version"] == 0
        )
        sync.close()
    finally:
        wide.close()


def test_weight_sync_needs_sync_endpoints(
    groups: tuple[LocalWorkerGroup[Any], LocalWorkerGroup[Any]],
) -> None:
    actor, _ = groups
    with pytest.raises(WeightSyncError, match="binds no"):
        WeightSync(actor, object())
    with pytest.raises(WeightSyncError, match="timeout_s must be > 0"):
        WeightSync(actor, actor, timeout_s=0)


def test_rollout_rejects_stale_versions_and_unstaged_commits(
    groups: tuple[LocalWorkerGroup[Any], LocalWorkerGroup[Any]],
) -> None:
    _, rollout = groups
    worker = rollout.workers[0]
    with pytest.raises(WeightSyncError, match="version 3 is not staged"):
        worker.sync_commit(3)
    with pytest.raises(WeightSyncError, match="no sync channel"):
        worker.sync_receive(None, 1)
    worker._sc_sync_version = 5
    with pytest.raises(WeightSyncError, match="version 2 is not newer than the served version 5"):
        worker.sync_receive(None, 2)


def test_delta_sync_is_bit_exact_and_small(
    groups: tuple[LocalWorkerGroup[Any], LocalWorkerGroup[Any]],
) -> None:
    """100 rounds of random sparse updates (about 2 % of the elements each): after every
    delta sync the rollout holds exactly the trainer's weights, and at most 6 % of the dense
    bytes crossed."""
    actor, rollout = groups
    module = actor.workers[0].actor_engine.module
    gen = torch.Generator().manual_seed(0)
    with WeightSync(actor, rollout, delta=True) as sync:
        sync.sync()  # the first sync over a channel is dense
        assert sync.last_wire_bytes >= sync.last_dense_bytes
        ratios = []
        for _ in range(100):
            with torch.no_grad():
                for param in module.parameters():
                    local = local_view(param)
                    hit = torch.rand(local.shape, generator=gen) < 0.02
                    local[hit] += torch.randn(int(hit.sum()), generator=gen)
            sync.sync()
            ratios.append(sync.last_wire_bytes / sync.last_dense_bytes)
            trainer = _params(actor, "actor_engine")
            served = _params(rollout, "rollout_engine")
            assert all(torch.equal(trainer[n], t) for n, t in served.items())
        assert max(ratios) <= 0.06, max(ratios)
        assert sync.version == 101


@pytest.mark.parametrize("action", ["kill", "raise"])
def test_a_rollout_rank_failing_mid_sync_is_named_by_rank_group_and_version(
    groups: tuple[LocalWorkerGroup[Any], LocalWorkerGroup[Any]], action: str
) -> None:
    # In-process groups have one rank; the Ray test (test_integration_sync_fault) kills
    # rank 1 of two.
    actor, rollout = groups
    sync = WeightSync(actor, rollout, timeout_s=10)
    assert sync.sync() == 1
    rollout.inject_fault(0, "sync_receive", action=action)  # type: ignore[arg-type]
    with pytest.raises(WeightSyncError, match=r"version 2 failed on rollout rank 0") as info:
        sync.sync()
    assert info.value.rank == 0
    assert info.value.group == "rollout"
    assert info.value.version == 2
    assert sync.version == 1
    copy = pickle.loads(pickle.dumps(info.value))
    assert (copy.rank, copy.group, copy.version) == (0, "rollout", 2)
