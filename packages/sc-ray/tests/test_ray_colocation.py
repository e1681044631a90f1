"""Colocation on Ray: spawn, fused workers (async role methods included, verl's raw fused
class subclassed by the user), groups sharing a GPU pool with fractional devices, split
pools. Local cluster: 8 CPUs, 8 fake GPUs."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import pytest
import ray
from sc_core import ConfigTypeError, UnknownRoleError, Worker
from sc_dispatch import Dispatch, register
from sc_ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
    split_resource_pool,
)

RAY_INIT: dict[str, Any] = {"num_cpus": 8, "num_gpus": 8}

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]


class Actor(Worker):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> tuple[str, int, float, int]:
        return "actor", self.rank, self.lr, os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def step(self, x: int) -> int:
        await asyncio.sleep(0)
        return x + self.rank


class Critic(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> tuple[str, int, float, int]:
        return "critic", self.rank, 0.0, os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def devices(self) -> str | None:
        return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_spawn_runs_roles_in_one_process() -> None:
    cls = create_colocated_worker_cls(
        {"actor": RayClassWithInitArgs(Actor, lr=0.5), "critic": RayClassWithInitArgs(Critic)}
    )
    pool = RayResourcePool([2], use_gpu=True, max_colocate_count=1)
    with RayWorkerGroup(pool, cls) as wg:
        groups = wg.spawn(["actor", "critic"])
        actor, critic = groups["actor"], groups["critic"]
        a = actor.describe()
        c = critic.describe()
        assert [x[:3] for x in a] == [("actor", 0, 0.5), ("actor", 1, 0.5)]
        assert [x[:2] for x in c] == [("critic", 0), ("critic", 1)]
        assert [x[3] for x in a] == [x[3] for x in c]  # same processes
        assert actor.step(1) == [1, 2]
        assert wg.actor_step(2) == [2, 3]
        with pytest.raises(UnknownRoleError, match="reward"):
            wg.spawn(["reward"])


def test_fused_workers_call_async_role_methods() -> None:
    cls = create_colocated_worker_cls_fused(
        {"actor": RayClassWithInitArgs(Actor), "critic": RayClassWithInitArgs(Critic)}
    )
    pool = RayResourcePool([2], use_gpu=False)
    with RayWorkerGroup(pool, cls) as wg:
        wg.fuse(["actor", "critic"])
        assert wg.actor.step(10) == [10, 11]
        assert [x[0] for x in wg.critic.describe()] == ["critic", "critic"]
        fused = wg.spawn_fused(["actor"])
        assert fused["actor"].step(1) == [1, 2]


def test_two_groups_share_a_gpu_pool_fractionally() -> None:
    pool = RayResourcePool([2], use_gpu=True, max_colocate_count=2)
    first = RayWorkerGroup(pool, RayClassWithInitArgs(Critic))
    second = RayWorkerGroup(pool, RayClassWithInitArgs(Critic))
    try:
        assert first.devices() == second.devices()
        assert len(set(first.devices())) == 2
        first.shutdown()
        assert pool.pgs is not None  # still used by the second group
    finally:
        first.shutdown()
        second.shutdown()
    assert pool.pgs is None


def test_groups_on_split_pools() -> None:
    pool = RayResourcePool([4], use_gpu=True, max_colocate_count=1)
    try:
        left, right = split_resource_pool(pool, [1, 3])
        with (
            RayWorkerGroup(left, RayClassWithInitArgs(Critic)) as a,
            RayWorkerGroup(right, RayClassWithInitArgs(Critic)) as b,
        ):
            assert a.world_size == 1
            assert b.world_size == 3
            devices = a.devices() + b.devices()
            assert len(set(devices)) == 4
    finally:
        pool.release()


# --- verl's tests/single_controller/test_fused_workers_on_cpu.py ------------------------------


@ray.remote
class FwActor(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, x: float) -> float:
        return x + self.rank


@ray.remote
class FwCritic(Worker):
    def __init__(self, val: float) -> None:
        super().__init__()
        self.val = val

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def sub(self, x: float) -> float:
        return x - self.val


FW_ROLES: dict[str, RayClassWithInitArgs] = {
    "actor": RayClassWithInitArgs(FwActor),
    "critic": RayClassWithInitArgs(FwCritic, val=10),
}
FusedBase = create_colocated_worker_raw_cls(FW_ROLES)


@ray.remote
class HybridWorker(FusedBase):  # type: ignore[misc,valid-type]
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def foo(self, x: float) -> float:
        out: float = self.critic.sub(self.actor.add(x))
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


def test_a_subclass_of_the_raw_fused_class_on_ray() -> None:
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    hybrid = RayClassWithInitArgs(cls=HybridWorker)
    hybrid.fused_worker_used = True
    with RayWorkerGroup(resource_pool=pool, ray_cls_with_init=hybrid) as fused_wg:
        assert fused_wg.fused_worker_used is True
        fused_wg.fuse(FW_ROLES.keys())
        x = fused_wg.actor.add(0.1)
        assert x == [0.1, 1.1]
        y = fused_wg.critic.sub(x)
        z = fused_wg.foo(0.1)
        assert z == pytest.approx(y)
        assert y == pytest.approx([-9.9, -8.9])
        # The role groups run in the fused group's actors.
        assert fused_wg.actor.workers == fused_wg.workers
        assert len(set(fused_wg.pid())) == 2


def test_spawn_of_a_fused_group_gives_one_group_per_role() -> None:
    # verl's tests/single_controller/test_colocated_workers_fused.py, without DataProto.
    cls = create_colocated_worker_cls_fused(FW_ROLES)
    assert isinstance(cls, RayClassWithInitArgs)
    assert cls.fused_worker_used is True
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, device_name="cpu")
    with RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu") as wg:
        spawned = wg.spawn(prefix_set=FW_ROLES.keys())
        assert spawned["actor"].add(1.0) == [1.0, 2.0]
        assert spawned["critic"].sub([20.0, 30.0]) == [10.0, 20.0]
        with pytest.raises(UnknownRoleError, match=r"unknown role 'reward'.*\['actor', 'critic'\]"):
            wg.spawn(["reward"])


def test_fused_builders_carry_ray_options_or_warn(caplog: pytest.LogCaptureFixture) -> None:
    actor = RayClassWithInitArgs(Actor)
    actor.update_options({"max_concurrency": 3})
    actor.set_additional_resource({"custom_x": 1})
    roles: dict[str, RayClassWithInitArgs] = {
        "actor": actor,
        "critic": RayClassWithInitArgs(Critic),
    }
    fused = create_colocated_worker_cls_fused(roles)
    assert fused.options == {"max_concurrency": 3}
    assert fused._additional_resource == {"custom_x": 1.0}
    with caplog.at_level(logging.WARNING, logger="sc_ray"):
        raw = create_colocated_worker_raw_cls(roles)
    assert raw.is_fused_worker is True  # type: ignore[attr-defined]
    assert "role 'actor' sets Ray options ['max_concurrency']" in caplog.text
    worker_dict = create_colocated_worker_cls(roles)
    assert worker_dict.fused_worker_used is False
    assert worker_dict.options == {"max_concurrency": 3}


def test_fused_worker_used_must_be_a_bool() -> None:
    cls = create_colocated_worker_cls_fused(FW_ROLES)
    cls.fused_worker_used = 1  # type: ignore[assignment]
    pool = RayResourcePool([1], use_gpu=False)
    with pytest.raises(ConfigTypeError, match=r"fused_worker_used of .* must be a bool, got int"):
        RayWorkerGroup(pool, cls)
