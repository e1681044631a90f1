"""``RayWorkerGroup.replace_ranks``: a killed actor is replaced on the same bundle with the same
environment and a new rendezvous port, every rank runs the re-form hook, the group object and
its views work again, sticky routing moves only the dead rank's sessions, and nothing is left
behind."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import ray
from sc_core import (
    InjectedFaultError,
    InvalidConfigError,
    Worker,
    WorkerDiedError,
    WorkerError,
    WorkerGroupClosedError,
    WorkerGroupError,
)
from sc_dispatch import Dispatch, Rows, make_sticky_dispatch_fn, register
from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from sc_ray import _ray_api as rapi

RAY_INIT: dict[str, Any] = {"num_cpus": 8, "namespace": "sc_ray_replace_tests"}

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

KEYS = ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "WG_PREFIX", "MY_SETTING")


class Member(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.reformed: list[list[int]] = []

    def on_group_reformed(self, replaced: list[int]) -> None:
        self.reformed.append(replaced)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @register(dispatch_mode=make_sticky_dispatch_fn("sid"))
    def turn(self, rows: Rows) -> Rows:
        """Each row, with the rank that served its session."""
        return Rows((row["sid"], self.rank) for row in rows)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def identity(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "env": {k: os.environ.get(k) for k in KEYS},
            "master": self.get_master_addr_port(),
            "env_master": (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")),
            "pid": os.getpid(),
            "pg": ctx.get_placement_group_id(),
            "reformed": self.reformed,
        }


def _group(prefix: str, standby: int = 0) -> RayWorkerGroup:
    pool = RayResourcePool([3], use_gpu=False, max_colocate_count=1)
    return RayWorkerGroup(
        pool,
        RayClassWithInitArgs(Member),
        name_prefix=prefix,
        worker_env={"MY_SETTING": "kept"},
        standby=standby,
    )


def _kill_and_wait(wg: RayWorkerGroup, rank: int) -> None:
    """Kill rank ``rank``'s actor and wait until the cluster reports it dead: ``ray.kill``
    returns before the actor is gone, so a call made at once may still reach it."""
    actor = wg.workers[rank]
    rapi.kill(actor)
    deadline = time.monotonic() + 30
    while rapi.actor_states()[rapi.actor_id(actor)].state != "DEAD":
        assert time.monotonic() < deadline, f"rank {rank}'s actor still alive 30 s after kill"
        time.sleep(0.05)


def test_a_killed_actor_is_replaced_in_place(ray_cluster: None) -> None:
    """Also sticky routing around it: sessions stay on their rank call after call; once the
    group knows rank 1 is dead, the next call moves its sessions (and only those) to live
    ranks, and after the replacement the moved sessions stay where they went while new ones
    may use the new rank."""
    with _group("replace") as wg:
        before = wg.identity()
        names = wg.worker_names
        sessions = Rows({"sid": f"s{i}"} for i in range(6))
        owners = dict(wg.turn(sessions))
        assert sorted(owners.values()) == [0, 0, 1, 1, 2, 2]
        assert dict(wg.turn(Rows(reversed(sessions)))) == owners
        _kill_and_wait(wg, 1)
        with pytest.raises(WorkerDiedError, match="rank 1"):
            wg.identity()
        moved = dict(wg.turn(sessions))
        for session, rank in owners.items():
            assert moved[session] == rank if rank != 1 else moved[session] in (0, 2)
        assert wg.replace_ranks() == [1]
        again = dict(wg.turn(Rows([*sessions, {"sid": "new"}])))
        assert {s: again[s] for s in moved} == moved
        assert again["new"] == 1
        after = wg.identity()
        assert [a["env"] for a in after] == [b["env"] for b in before]
        assert after[1]["env"]["MY_SETTING"] == "kept"
        assert after[1]["pid"] != before[1]["pid"]
        assert [a["pid"] for a in after[::2]] == [b["pid"] for b in before[::2]]
        assert {a["pg"] for a in after} == {before[0]["pg"]}  # the same placement group
        # one new rendezvous address, in every rank's environment and accessors
        masters = {a["master"] for a in after} | {a["env_master"] for a in after}
        assert len(masters) == 1
        assert masters != {before[0]["master"]}
        assert (wg.master_address, wg.master_port) == next(iter(masters))
        assert [a["reformed"] for a in after] == [[[1]], [[1]], [[1]]]
        assert wg.worker_names[0::2] == names[0::2]
        assert wg.worker_names[1] == f"{names[1]}-g1"
        assert wg.alive_ranks() == [0, 1, 2]


@pytest.mark.extended
def test_several_ranks_and_a_second_replacement(ray_cluster: None) -> None:
    with _group("replace2") as wg:
        for rank in (0, 2):  # ray.kill returns before the cluster sees the actor dead
            _kill_and_wait(wg, rank)
        assert wg.replace_ranks() == [0, 2]
        assert [i["env"]["RANK"] for i in wg.identity()] == ["0", "1", "2"]
        assert wg.replace_ranks([1]) == [1]  # a live rank, on request
        info = wg.identity()
        assert [i["reformed"] for i in info] == [[[0, 2], [1]], [[1]], [[0, 2], [1]]]
        assert wg.worker_names[1].endswith("-g2")


def test_a_group_of_detached_actors_cannot_start_new_ones(ray_cluster: None) -> None:
    pool = RayResourcePool([1], use_gpu=False)
    with RayWorkerGroup(
        pool, RayClassWithInitArgs(Member), name_prefix="replace_det", detached=True
    ) as owner:
        attached = RayWorkerGroup.from_detached(
            worker_names=owner.worker_names, ray_cls_with_init=RayClassWithInitArgs(Member)
        )
        with pytest.raises(WorkerGroupError, match=r"from_detached.*no pool to start new"):
            attached.replace_ranks([0])
        attached.shutdown(release_pool=False)


def test_injected_faults_kill_inside_a_method_or_raise(ray_cluster: None) -> None:
    with _group("faults") as wg:
        pids = wg.nap(0.0)
        wg.inject_fault(2, "nap", action="raise")
        with pytest.raises(WorkerError, match="rank 2") as raised:
            wg.nap(0.0)
        assert isinstance(raised.value, InjectedFaultError)
        assert wg.nap(0.0) == pids  # fired once; nobody died
        wg.inject_fault(0, "nap", delay_s=0.3)
        with pytest.raises(WorkerDiedError, match="rank 0"):
            wg.nap(3.0)  # rank 0's process exits 0.3 s into the nap
        assert wg.replace_ranks() == [0]
        after = wg.nap(0.0)
        assert after[0] != pids[0]
        assert after[1:] == pids[1:]  # ranks 1 and 2 finished their naps and kept going


def test_kill_worker_kills_the_actor_and_the_next_call_finds_it_dead(ray_cluster: None) -> None:
    with _group("kill") as wg:
        pids = wg.nap(0.0)
        actor = wg.workers[1]
        wg.kill_worker(1)  # returns once the cluster reports the actor dead
        assert rapi.actor_states()[rapi.actor_id(actor)].state == "DEAD"
        assert wg.dead_ranks == [1]
        with pytest.raises(WorkerDiedError, match=r"nap: worker rank 1 died \(killed with kill"):
            wg.nap(0.0)
        with pytest.raises(InvalidConfigError, match=r"kill_worker: rank must be an int in \[0, 3"):
            wg.kill_worker(3)
        assert wg.replace_ranks() == [1]
        after = wg.nap(0.0)
        assert after[1] != pids[1]
        assert after[::2] == pids[::2]
    with pytest.raises(WorkerGroupClosedError, match="kill_worker"):
        wg.kill_worker(0)


def test_a_hot_standby_takes_over_and_is_replaced(ray_cluster: None) -> None:
    with _group("standby", standby=1) as wg:
        before = wg.identity()
        wg.wait_for_standby()
        (spare,) = wg.standby_names
        _kill_and_wait(wg, 2)
        assert wg.replace_ranks() == [2]
        assert wg.worker_names[2] == spare  # the spare became rank 2
        after = wg.identity()
        assert after[2]["env"] == before[2]["env"]
        assert after[2]["pid"] != before[2]["pid"]
        assert [a["reformed"] for a in after] == [[[2]], [[2]], [[2]]]
        masters = {a["master"] for a in after}
        assert len(masters) == 1
        assert masters != {before[0]["master"]}
        (second,) = wg.standby_names  # a new spare started in the background
        assert second != spare
        wg.wait_for_standby()
        _kill_and_wait(wg, 0)
        assert wg.replace_ranks() == [0]
        assert wg.worker_names[0] == second
        assert [i["env"]["RANK"] for i in wg.identity()] == ["0", "1", "2"]
    assert rapi.actor_states()  # the group's close killed the spare too
    alive = {s.name for s in rapi.actor_states().values() if s.state == "ALIVE"}
    assert not any(name.startswith("standby") for name in alive)


def test_standby_arguments_are_checked(ray_cluster: None) -> None:
    for bad in (-1, True, 1.5):
        with pytest.raises(InvalidConfigError, match="standby must be an int >= 0"):
            _group("standby_bad", standby=bad)  # type: ignore[arg-type]
