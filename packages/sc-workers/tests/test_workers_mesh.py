"""Mesh registration: what each rank tells the dispatcher, for several layouts.

Workers register their meshes on construction, before any process group exists, so the
layouts of a whole group can be checked in one process (one worker per rank, with that
rank's environment).
"""

from __future__ import annotations

from typing import Any

import pytest
from _workers_helpers import actor_config, critic_config, per_rank
from sc_dispatch import MeshLayoutError
from sc_dispatch.ext import mesh_layout
from sc_dispatch.testing import FakeWorkerGroup
from sc_workers import ActorRolloutRefWorker, ConfigError, CriticWorker


def _group(workers: list[Any], mesh: str) -> FakeWorkerGroup:
    """A worker group over ``workers`` as far as ``mesh`` goes: each rank answers what its
    worker registered (``None`` for a mesh it did not register)."""
    tables = [w.get_dispatch_collect() for w in workers]
    answers = (
        [t["dispatch_dp_rank"].get(mesh) for t in tables],
        [t["collect_dp_rank"].get(mesh) for t in tables],
    )
    return FakeWorkerGroup(len(workers), {mesh: answers})


def test_tp2_dp2_registers_dp_ranks_and_collect_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = actor_config("megatron", tp=2, mini=4)
    actors = per_rank(monkeypatch, 4, lambda: ActorRolloutRefWorker(cfg, "actor_rollout_ref"))
    critics = per_rank(monkeypatch, 4, lambda: CriticWorker(critic_config("megatron", tp=2)))
    for workers, meshes in ((actors, ("actor", "rollout", "ref")), (critics, ("critic",))):
        for mesh in meshes:
            layout = mesh_layout(_group(workers, mesh), mesh)
            assert layout == ([0, 0, 1, 1], [True, False, True, False])


def test_fsdp_registers_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    actors = per_rank(monkeypatch, 2, lambda: ActorRolloutRefWorker(actor_config(), "actor"))
    assert mesh_layout(_group(actors, "actor"), "actor") == ([0, 1], [True, True])
    # the role decides which meshes exist
    assert set(actors[0].get_dispatch_collect()["dispatch_dp_rank"]) == {"actor"}
    with pytest.raises(MeshLayoutError, match="no rank registered the mesh 'rollout'"):
        mesh_layout(_group(actors, "rollout"), "rollout")


@pytest.mark.parametrize(
    ("role", "meshes"),
    [
        ("actor", {"actor"}),
        ("rollout", {"rollout"}),
        ("ref", {"ref"}),
        ("actor_rollout", {"actor", "rollout"}),
        ("actor_rollout_ref", {"actor", "rollout", "ref"}),
    ],
)
def test_roles_register_their_meshes(
    monkeypatch: pytest.MonkeyPatch, role: str, meshes: set[str]
) -> None:
    (worker,) = per_rank(monkeypatch, 1, lambda: ActorRolloutRefWorker(actor_config(), role))
    assert set(worker.get_dispatch_collect()["dispatch_dp_rank"]) == meshes


def test_bad_roles_and_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"role must be one of .* got 'critic'"):
        ActorRolloutRefWorker(actor_config(), "critic")
    with pytest.raises(ConfigError, match="is not divisible by dp size 4"):
        ActorRolloutRefWorker(actor_config(mini=6), "actor")
    monkeypatch.setenv("WORLD_SIZE", "6")
    with pytest.raises(
        ConfigError, match="world size 6 is not divisible by tensor_model_parallel_size 4"
    ):
        CriticWorker(critic_config("megatron", tp=4))
    with pytest.raises(ConfigError, match="must be an ActorRolloutRefConfig or a mapping, got int"):
        ActorRolloutRefWorker(3, "actor")  # type: ignore[arg-type]


def test_config_may_be_a_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    worker = ActorRolloutRefWorker({"rollout": {"n": 2}, "device": "cpu"}, "actor")
    assert worker.config.rollout.n == 2
    assert worker.actor_batch_sizes is not None
    assert worker.actor_batch_sizes.mini_batch_size == 8
