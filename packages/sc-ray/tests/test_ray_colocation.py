"""Colocation on Ray: spawn, fused workers (async role methods included), groups sharing a
GPU pool with fractional devices, split pools. Local cluster: 8 CPUs, 8 fake GPUs."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from sc_core import UnknownRoleError, Worker
from sc_dispatch import Dispatch, register
from sc_ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
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
