"""RayResourcePool (device names included), split/merge (groups on a merged pool and on its
parts together), ResourcePoolManager and RayClassWithInitArgs on a local cluster with 8
CPUs, 8 fake GPUs and 4 units of a custom resource."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import ray
import sc_core
from sc_core import UnknownRoleError, Worker
from sc_dispatch import Dispatch, register
from sc_dispatch._setting import SettingValueError
from sc_ray import (
    InsufficientResourcesError,
    PlacementTimeoutError,
    RayClassWithInitArgs,
    RayResourcePool,
    RayResourcePoolError,
    RayWorkerGroup,
    ResourcePoolManager,
    ScRayError,
    WorkerEnvError,
    merge_resource_pool,
    split_resource_pool,
)
from sc_ray import _ray_api as rapi

RAY_INIT: dict[str, Any] = {"num_cpus": 8, "num_gpus": 8, "resources": {"custom_a": 4}}

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_leaks")]


class Probe:
    """A tiny actor class reporting where it runs."""

    def info(self) -> dict[str, Any]:
        return {
            "node": rapi.current_node_id(),
            "gpus": rapi.gpu_ids(),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "env": {k: v for k, v in os.environ.items() if k.startswith("SC_TEST_")},
        }


def _placed(pool: RayResourcePool) -> bool:
    return pool.pgs is not None


def _states(pool: RayResourcePool) -> list[str]:
    return [rapi.placement_group_state(pg) for pg in pool.pgs or []]


def test_cpu_pool_reserves_only_what_workers_use() -> None:
    # verl reserves processes x max_colocate_count CPUs (8 x 10 here): infeasible on 8 CPUs.
    pool = RayResourcePool([4, 4], use_gpu=False, max_colocate_count=10)
    try:
        pgs = pool.get_placement_groups()
        assert len(pgs) == 2
        assert [rapi.placement_group_bundles(pg) for pg in pgs] == [[{"CPU": 1.0}] * 4] * 2
        assert pool.get_placement_groups() is pgs
        assert pool.actor_resources() == {"num_cpus": pytest.approx(0.1)}
        assert pool.world_size == 8
        assert pool.local_rank_list() == [0, 1, 2, 3] * 2
        slots = pool.bundle_slots()
        assert [(s.node_index, s.bundle_index, s.local_world_size) for s in slots][:5] == [
            (0, 0, 4),
            (0, 1, 4),
            (0, 2, 4),
            (0, 3, 4),
            (1, 0, 4),
        ]
    finally:
        pool.release()
    assert pool.pgs is None


def test_gpu_pool_bundles_hold_one_device_each() -> None:
    pool = RayResourcePool([2], use_gpu=True, max_colocate_count=2, accelerator_type="custom_a")
    try:
        (pg,) = pool.get_placement_groups()
        assert rapi.placement_group_bundles(pg) == [{"CPU": 1.0, "GPU": 1.0, "custom_a": 1e-4}] * 2
        assert pool.actor_resources() == {"num_cpus": 0.5, "num_gpus": 0.5}
        assert pool.device_resource == "GPU"
    finally:
        pool.release()


def test_npu_pool_asks_for_npu_resource() -> None:
    pool = RayResourcePool([1], device_name="npu")
    assert pool.bundle() == {"CPU": 1.0, "NPU": 1.0}
    assert pool.actor_resources() == {"num_cpus": 0.1, "NPU": 0.1}


def test_pool_larger_than_the_cluster_fails_at_once_naming_ask_and_cluster() -> None:
    pool = RayResourcePool([12], use_gpu=False, name_prefix="huge_", placement_timeout_s=120)
    start = time.monotonic()
    with pytest.raises(InsufficientResourcesError) as info:
        pool.get_placement_groups()
    assert time.monotonic() - start < 30  # not the 120 s placement deadline
    text = str(info.value)
    assert "process_on_nodes=[12]" in text
    assert "asks {CPU: 12}" in text
    assert "CPU: 8" in text  # what the cluster has
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, RayResourcePoolError)
    assert pool.pgs is None
    with pytest.raises(InsufficientResourcesError, match=r"asks \{CPU: 9, GPU: 9\}"):
        RayResourcePool([9], use_gpu=True, name_prefix="gpus_").get_placement_groups()


def test_pool_the_cluster_could_hold_later_times_out_naming_ask_and_cluster() -> None:
    holder = RayResourcePool([6], use_gpu=False, name_prefix="holder_")
    holder.get_placement_groups()  # 6 of the 8 CPUs are taken for now
    try:
        pool = RayResourcePool([4], use_gpu=False, name_prefix="big_", placement_timeout_s=1)
        with pytest.raises(PlacementTimeoutError) as info:
            pool.get_placement_groups()
        text = str(info.value)
        assert "process_on_nodes=[4]" in text
        assert "{CPU: 1}" in text
        assert "CPU: 8" in text  # what the cluster has
        assert isinstance(info.value, TimeoutError)
        assert not isinstance(info.value, ValueError)
        assert isinstance(info.value, ScRayError)
        assert pool.pgs is None
        # A retry does not trip over a leftover group of the same name.
        with pytest.raises(PlacementTimeoutError):
            pool.get_placement_groups()
    finally:
        holder.release()
    ok = RayResourcePool([2], use_gpu=False, name_prefix="big_", placement_timeout_s=5)
    try:
        assert len(ok.get_placement_groups()) == 1
    finally:
        ok.release()


def test_placement_timeout_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    holder = RayResourcePool([8], use_gpu=True, name_prefix="gpuholder_")
    holder.get_placement_groups()
    monkeypatch.setenv("SC_RAY_PLACEMENT_TIMEOUT_S", "0.5")
    try:
        with pytest.raises(PlacementTimeoutError, match=r"within 0\.5 s"):
            RayResourcePool([1], use_gpu=True, name_prefix="envt_").get_placement_groups()
    finally:
        holder.release()
    monkeypatch.setenv("SC_RAY_PLACEMENT_TIMEOUT_S", "soon")
    with pytest.raises(SettingValueError, match="SC_RAY_PLACEMENT_TIMEOUT_S='soon'"):
        RayResourcePool([1], use_gpu=False).get_placement_groups()


def test_taken_name_is_refused_clearly() -> None:
    first = RayResourcePool([1], use_gpu=False, name_prefix="dup_")
    try:
        first.get_placement_groups()
        second = RayResourcePool([1], use_gpu=False, name_prefix="dup_")
        with pytest.raises(RayResourcePoolError, match="already exist"):
            second.get_placement_groups()
    finally:
        first.release()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"process_on_nodes": [2, 0]}, "positive"),
        ({"process_on_nodes": [1], "max_colocate_count": 0}, "max_colocate_count"),
        ({"process_on_nodes": [1], "device_name": "tpu"}, "device_name"),
        ({"process_on_nodes": [1], "num_cpus_per_process": 0}, "num_cpus_per_process"),
        ({"process_on_nodes": [1], "placement_timeout_s": -1}, "placement_timeout_s"),
    ],
)
def test_bad_pool_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(sc_core.ResourcePoolError, match=match):
        RayResourcePool(**kwargs)


def test_empty_pool_and_bad_strategy() -> None:
    with pytest.raises(RayResourcePoolError, match="no nodes"):
        RayResourcePool(use_gpu=False).get_placement_groups()
    with pytest.raises(RayResourcePoolError, match="strategy"):
        RayResourcePool([1], use_gpu=False).get_placement_groups(strategy="LOOSE")


def test_add_node_before_and_after_placement() -> None:
    pool = RayResourcePool(use_gpu=False)
    pool.add_node(1)
    pool.add_node(2)
    assert pool.store == [1, 2]
    try:
        pool.get_placement_groups(strategy="PACK")
        with pytest.raises(RayResourcePoolError, match="already placed"):
            pool.add_node(1)
    finally:
        pool.release()


def test_split_and_merge() -> None:
    parts = RayResourcePool([2], use_gpu=False), RayResourcePool([2], use_gpu=False)
    merged = merge_resource_pool(*parts)
    assert merged.store == [2, 2]
    try:
        # verl's merge: the merged pool is the parts' placement groups, in order.
        assert merged.pgs == [*parts[0].pgs, *parts[1].pgs]  # type: ignore[misc]
        halves = split_resource_pool(merged, 2)
        assert [h.world_size for h in halves] == [2, 2]
        uneven = split_resource_pool(merged, [1, 3])
        assert [h.store for h in uneven] == [[1], [1, 2]]
        slots = uneven[1].bundle_slots()
        assert [(s.node_index, s.local_rank, s.local_world_size) for s in slots] == [
            (0, 0, 1),
            (1, 0, 2),
            (1, 1, 2),
        ]
        assert slots[0].bundle_index == 1
        uneven[1].release()  # a sub-pool does not own the groups
        merged.release()  # nor does a merged pool
        assert all(state == "CREATED" for state in _states(merged))
        with pytest.raises(RayResourcePoolError, match="divide"):
            split_resource_pool(merged, 3)
        with pytest.raises(RayResourcePoolError, match="add up"):
            split_resource_pool(merged, [1, 1])
        with pytest.raises(RayResourcePoolError, match="share bundles"):
            merge_resource_pool(merged, parts[0])
    finally:
        for part in parts:
            part.release()


def test_merged_pool_of_sub_pools_and_overlaps() -> None:
    root = RayResourcePool([3], use_gpu=False)
    try:
        left, right = split_resource_pool(root, [1, 2])
        merged = merge_resource_pool(right, left)
        assert merged.world_size == 3
        assert merged.store == [2, 1]
        slots = merged.bundle_slots()
        assert [(s.bundle_index, s.node_index, s.local_rank) for s in slots] == [
            (1, 0, 0),
            (2, 0, 1),
            (0, 1, 0),
        ]
        again = split_resource_pool(root, [1, 2])[0]  # the same bundle as ``left``
        with pytest.raises(RayResourcePoolError, match=r"share bundles \(rp2's ranks \[0\]\)"):
            merge_resource_pool(left, again)
        with pytest.raises(RayResourcePoolError, match="merged with itself"):
            merge_resource_pool(left, left)
        assert "merge_resource_pool(" in repr(merged)
    finally:
        root.release()


@pytest.mark.parametrize(
    ("field", "first", "second"),
    [
        ("use_gpu", {"use_gpu": True}, {"use_gpu": False}),
        ("max_colocate_count", {"max_colocate_count": 2}, {"max_colocate_count": 3}),
        ("n_gpus_per_node", {"n_gpus_per_node": 8}, {"n_gpus_per_node": 16}),
        ("detached", {"detached": False}, {"detached": True}),
        ("device_name", {"device_name": "cuda"}, {"device_name": "npu"}),
        ("num_cpus_per_process", {"num_cpus_per_process": 1}, {"num_cpus_per_process": 2}),
    ],
)
def test_merge_refuses_pools_that_differ(
    field: str, first: dict[str, Any], second: dict[str, Any]
) -> None:
    rp1, rp2 = RayResourcePool([1], **first), RayResourcePool([1], **second)
    with pytest.raises(ValueError, match=f"pools differ in {field}") as info:
        merge_resource_pool(rp1, rp2)
    assert isinstance(info.value, RayResourcePoolError)
    text = str(info.value)
    assert f"rp1 has {field}={getattr(rp1, field)!r}" in text
    assert f"rp2 has {field}={getattr(rp2, field)!r}" in text
    assert rp1.pgs is None  # nothing was placed
    assert rp2.pgs is None


def test_merge_refuses_what_is_not_a_pool() -> None:
    with pytest.raises(TypeError, match="rp2 must be a RayResourcePool, got ResourcePool") as info:
        merge_resource_pool(RayResourcePool([1]), sc_core.ResourcePool([1]))  # type: ignore[arg-type]
    assert isinstance(info.value, sc_core.ConfigTypeError)


class Where(Worker):
    """Reports the placement group and the device each rank runs on."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self) -> tuple[str | None, str | None]:
        return ray.get_runtime_context().get_placement_group_id(), os.environ.get(
            "CUDA_VISIBLE_DEVICES"
        )


@pytest.mark.extended
def test_groups_on_a_merged_pool_and_on_its_parts_share_the_bundles() -> None:
    # The parts hold 3 of the 8 GPUs; a merged pool reserving bundles of its own would get
    # other devices. max_colocate_count=2: two groups per bundle.
    first = RayResourcePool([2], use_gpu=True, max_colocate_count=2)
    second = RayResourcePool([1], use_gpu=True, max_colocate_count=2)
    merged = merge_resource_pool(first, second)
    cls = RayClassWithInitArgs(Where)
    on_merged = RayWorkerGroup(merged, cls)
    try:
        with RayWorkerGroup(first, cls) as on_first, RayWorkerGroup(second, cls) as on_second:
            pg_first = rapi.placement_group_id(first.get_placement_groups()[0])
            pg_second = rapi.placement_group_id(second.get_placement_groups()[0])
            everywhere = on_merged.where()
            assert [pg for pg, _ in everywhere] == [pg_first, pg_first, pg_second]
            assert everywhere[:2] == on_first.where()
            assert everywhere[2:] == on_second.where()
            assert len({device for _, device in everywhere}) == 3
        # The parts' groups are closed; the merged group still holds both parts.
        assert [_placed(p) for p in (first, second, merged)] == [True, True, True]
        assert on_merged.where() == everywhere
    finally:
        on_merged.close()
    # The last group using the parts released them.
    assert [_placed(p) for p in (first, second, merged)] == [False, False, False]


def test_cpu_device_name_with_use_gpu_false() -> None:
    pool = RayResourcePool([1], use_gpu=False, device_name="cpu")
    assert pool.device_name == "cpu"
    assert pool.bundle() == {"CPU": 1.0}
    assert pool.actor_resources() == {"num_cpus": pytest.approx(0.1)}
    assert RayResourcePool([1], use_gpu=False, device_name="CUDA").device_name == "cuda"
    try:
        with RayWorkerGroup(pool, RayClassWithInitArgs(Where), device_name="cpu") as wg:
            assert wg.device_name == "cpu"
            assert wg.where()[0][1] is None or wg.where()[0][1] == ""
    finally:
        pool.release()
    cpu_manager = ResourcePoolManager({"p": [1]}, {"A": "p"}, use_gpu=False, device_name="cpu")
    assert cpu_manager.device_name == "cpu"
    # verl asks no accelerator for an actor of device "cpu"
    opts = RayClassWithInitArgs(Probe).actor_options(None, 0, use_gpu=True, device_name="cpu")
    assert "num_gpus" not in opts
    assert "resources" not in opts


def test_impossible_device_names_are_refused() -> None:
    with pytest.raises(ValueError, match=r"RayResourcePool: device_name='cpu' with use_gpu=True"):
        RayResourcePool([1], use_gpu=True, device_name="cpu")
    with pytest.raises(
        RayResourcePoolError, match=r"one of \['cpu', 'cuda', 'gpu', 'npu'\], got int 3"
    ):
        RayResourcePool([1], device_name=3)  # type: ignore[arg-type]
    with pytest.raises(RayResourcePoolError, match=r"get_placement_groups: device_name='cpu' with"):
        RayResourcePool([1]).get_placement_groups(device_name="cpu")
    with pytest.raises(RayResourcePoolError, match="got str 'tpu'"):
        RayResourcePool([1], use_gpu=False).get_placement_groups(device_name="tpu")
    gpu_pool = RayResourcePool([1], use_gpu=True)
    with pytest.raises(RayResourcePoolError, match=r"RayWorkerGroup: device_name='cpu' with"):
        RayWorkerGroup(gpu_pool, RayClassWithInitArgs(Where), device_name="cpu")
    with pytest.raises(RayResourcePoolError, match="RayWorkerGroup: device_name must be one of"):
        RayWorkerGroup(gpu_pool, RayClassWithInitArgs(Where), device_name="xpu")
    assert gpu_pool.pgs is None  # refused before placing anything
    with pytest.raises(RayResourcePoolError, match=r"ResourcePoolManager: device_name='cpu' with"):
        ResourcePoolManager({"p": [1]}, {"A": "p"}, use_gpu=True, device_name="cpu")


def test_resource_pool_manager() -> None:
    manager = ResourcePoolManager(
        {"actor": [2], "critic": [2]}, {"Actor": "actor", "Rollout": "actor", "Critic": "critic"}
    )
    assert manager.get_n_gpus() == 4
    manager.create_resource_pool()
    try:
        actor = manager.get_resource_pool("Actor")
        assert actor is manager.get_resource_pool("Rollout")
        assert actor is not manager.get_resource_pool("Critic")
        assert len(actor.get_placement_groups()) == 1
        with pytest.raises(KeyError, match="role 'Reward' has no pool") as info:
            manager.get_resource_pool("Reward")
        assert isinstance(info.value, UnknownRoleError)
    finally:
        manager.release()
    with pytest.raises(RayResourcePoolError, match="ask 16 GPU"):
        ResourcePoolManager({"p": [8, 8]}, {"A": "p"}).create_resource_pool()
    with pytest.raises(RayResourcePoolError, match="ask 12 CPU"):
        ResourcePoolManager({"p": [6], "q": [6]}, {"A": "p"}, use_gpu=False).create_resource_pool()
    with pytest.raises(RayResourcePoolError, match="does not define"):
        ResourcePoolManager({"p": [1]}, {"A": "nope"})


def test_class_with_init_args_options_merge() -> None:
    cls = RayClassWithInitArgs(Probe)
    cls.update_options({"runtime_env": {"env_vars": {"SC_TEST_USER": "1"}}, "max_concurrency": 2})
    cls.update_options({"runtime_env": {"env_vars": {"SC_TEST_MORE": "2"}}})
    cls.set_additional_resource({"custom_a": 1})  # a single key is honoured
    opts = cls.actor_options(None, 0, use_gpu=False, env_vars={"SC_TEST_GROUP": "3"})
    assert opts["runtime_env"]["env_vars"] == {
        "SC_TEST_USER": "1",
        "SC_TEST_MORE": "2",
        "SC_TEST_GROUP": "3",
    }
    assert opts["resources"] == {"custom_a": 1.0}
    assert opts["max_concurrency"] == 2
    with pytest.raises(WorkerEnvError, match="SC_TEST_USER"):
        cls.actor_options(None, 0, use_gpu=False, env_vars={"SC_TEST_USER": "other"})
    with pytest.raises(RayResourcePoolError, match="non-negative"):
        cls.set_additional_resource({"custom_a": -1})
    with pytest.raises(RayResourcePoolError, match="mapping"):
        cls.update_options([("num_cpus", 1)])  # type: ignore[arg-type]


def test_actors_on_bundles_share_fake_gpus_and_node() -> None:
    pool = RayResourcePool([2], use_gpu=True, max_colocate_count=2)
    actors: list[rapi.ActorHandle] = []
    try:
        (pg,) = pool.get_placement_groups()
        cls = RayClassWithInitArgs(Probe)
        cls.update_options({"runtime_env": {"env_vars": {"SC_TEST_USER": "u"}}})
        share = pool.actor_resources()
        for bundle in (0, 0, 1):
            actors.append(
                cls(
                    pg, bundle, use_gpu=True, num_gpus=share["num_gpus"], num_cpus=share["num_cpus"]
                )
            )
        infos = rapi.get([rapi.call_actor(a, "info", (), {}) for a in actors], timeout_s=30)
        # Two actors colocated on bundle 0 share its device; bundle 1 has another.
        assert infos[0]["cuda"] == infos[1]["cuda"]
        assert infos[0]["cuda"] != infos[2]["cuda"]
        assert all(len(i["gpus"]) == 1 for i in infos)
        assert infos[0]["env"] == {"SC_TEST_USER": "u"}
        sharer = cls(sharing_with=actors[2], use_gpu=False)
        actors.append(sharer)
        (shared,) = rapi.get([rapi.call_actor(sharer, "info", (), {})], timeout_s=30)
        assert shared["node"] == infos[2]["node"]
        assert shared["cuda"] == infos[2]["cuda"]
    finally:
        for actor in actors:
            rapi.kill(actor)
        pool.release()
