"""The trainer on the in-process backend (sc-core's ResourcePoolManager and LocalWorkerGroup):
runs, typed role groups, and the typed errors of a misused trainer or backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _trainer_runs import assert_finite_training_metrics, assert_same_metrics, run, tiny_config
from sc_core import (
    ClassWithInitArgs,
    LocalWorkerGroup,
    ResourcePool,
    ResourcePoolManager,
    UnknownRoleError,
    Worker,
    create_colocated_worker_cls,
)
from sc_trainer import (
    InProcessLauncher,
    RayLauncher,
    RayPPOTrainer,
    Role,
    RunOutput,
    RunResult,
    TaskRunner,
    TrainerConfigError,
)
from sc_trainer.launch import BackendMismatchError
from sc_trainer.runs import read_metrics
from sc_trainer.tasks import DigitsTask
from sc_trainer.trainer import TrainerStateError, registered_method_names, role_group
from sc_workers import ActorRolloutRefWorker, CriticWorker

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ppo_local(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """PPO on the local backend, critic colocated with the actor: 4 steps."""
    return run(tiny_config(tmp_path_factory.mktemp("ppo_local"), backend="local"))


def test_local_ppo_run_trains_and_checkpoints(ppo_local: RunResult) -> None:
    history = read_metrics(ppo_local.output.metrics_path)
    assert [r["step"] for r in history] == [0, 1, 2, 3, 4]
    assert_finite_training_metrics(history, critic=True)
    assert (ppo_local.checkpoint / "critic").is_dir()
    assert (ppo_local.output.checkpoint_dir(2) / "trainer_state.json").is_file()


def test_local_separate_pools_give_the_same_numbers_as_colocated(
    ppo_local: RunResult, tmp_path: Path
) -> None:
    separate = run(tiny_config(tmp_path, backend="local", colocate=False))
    assert_same_metrics(
        read_metrics(separate.output.metrics_path), read_metrics(ppo_local.output.metrics_path)
    )


def test_local_grpo_run_has_no_critic(tmp_path: Path) -> None:
    result = run(tiny_config(tmp_path, backend="local", algorithm="grpo", steps=2))
    assert_finite_training_metrics(read_metrics(result.output.metrics_path), critic=False)
    assert not (result.checkpoint / "critic").exists()


def _trainer(tmp_path: Path, **overrides: Any) -> RayPPOTrainer:
    runner = TaskRunner(tiny_config(tmp_path, backend="local", **overrides))
    return runner.build_trainer(InProcessLauncher())


def test_the_local_backend_uses_sc_cores_pool_manager(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, colocate=False)
    manager = trainer.resource_pool_manager
    assert type(manager) is ResourcePoolManager
    assert manager.resource_pool_spec == {"global_pool": [1], "critic_pool": [1]}
    manager.create_resource_pool()
    assert manager.get_resource_pool(Role.Critic).store == [1]
    with pytest.raises(UnknownRoleError, match="role 'reward' has no pool"):
        manager.get_resource_pool("reward")


def test_groups_before_init_workers_and_after_close_are_state_errors(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, algorithm="grpo")
    with pytest.raises(TrainerStateError, match=r"actor_rollout_wg: no worker groups"):
        _ = trainer.actor_rollout_wg
    with InProcessLauncher().running():
        trainer.init_workers()
        try:
            wg = trainer.actor_rollout_wg
            assert isinstance(wg, LocalWorkerGroup)
            assert trainer.ref_policy_wg is wg
            with pytest.raises(TrainerStateError, match=r"algorithm 'grpo' runs no critic"):
                _ = trainer.critic_wg
            with pytest.raises(TrainerStateError, match="already up"):
                trainer.init_workers()
        finally:
            trainer.close()
    with pytest.raises(TrainerStateError, match=r"critic_wg: no worker groups"):
        _ = trainer.critic_wg
    trainer.close()  # twice is fine


@pytest.mark.parametrize(
    ("mapping", "match"),
    [
        ({Role.Critic: CriticWorker}, r"needs Role.ActorRolloutRef"),
        ({Role.ActorRolloutRef: CriticWorker}, r"\[Role.ActorRolloutRef\] must be Actor"),
        (
            {Role.ActorRolloutRef: ActorRolloutRefWorker, Role.Critic: ActorRolloutRefWorker},
            r"\[Role.Critic\] must be CriticWorker or a subclass",
        ),
        ({"actor": ActorRolloutRefWorker}, r"keys \['actor'\] that are no Role"),
    ],
)
def test_a_bad_role_worker_mapping_is_a_config_error(
    tmp_path: Path, mapping: dict[Any, type], match: str
) -> None:
    cfg = tiny_config(tmp_path, backend="local")
    with pytest.raises(TrainerConfigError, match=match):
        RayPPOTrainer(
            cfg,
            DigitsTask(cfg.task),
            mapping,
            ResourcePoolManager({"p": [1]}, {}),
            InProcessLauncher(),
            RunOutput(cfg.output_dir),
        )


class _Plain:
    """Not a worker."""


class _Tiny(Worker):
    """A worker without methods."""


def test_role_group_checks_the_spawned_group_binds_the_roles_methods(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    critic = ClassWithInitArgs(CriticWorker, config=trainer.critic_config)
    colocated = create_colocated_worker_cls({"critic": critic})
    wg = LocalWorkerGroup(ResourcePool([1]), colocated)
    try:
        spawned = wg.spawn(["critic"])
        typed = role_group(spawned, "critic", critic)
        assert typed is spawned["critic"]
        assert set(registered_method_names(CriticWorker)) <= set(typed.bound_method_names)
        actor = ClassWithInitArgs(ActorRolloutRefWorker, config=trainer.actor_rollout_ref_config)
        with pytest.raises(TrainerStateError, match=r"does not bind \[.*'compute_log_prob'"):
            role_group(spawned, "critic", actor)
        with pytest.raises(TrainerStateError, match=r"no group for role 'actor'"):
            role_group(spawned, "actor", actor)
        with pytest.raises(TrainerStateError, match=r"not a class"):
            role_group(spawned, "critic", ClassWithInitArgs(lambda: _Plain()))
    finally:
        wg.close()


def test_pieces_of_one_backend_given_to_the_other_are_refused() -> None:
    ray_launcher = RayLauncher(num_cpus=1)
    local_cls = ClassWithInitArgs(_Tiny)
    with pytest.raises(BackendMismatchError, match=r"RayLauncher.worker_group: pool must be a Ray"):
        ray_launcher.worker_group(ResourcePool([1]), local_cls)
    with InProcessLauncher().worker_group(ResourcePool([1]), local_cls) as local_wg:
        assert not local_wg.closed
    assert local_wg.closed
