"""Replacing ranks in place (``WorkerGroup.replace_ranks``) on the in-process backend: new
workers with the same identity, the group re-formed through the worker hook, the same group
object and views working again, and every error path."""

from __future__ import annotations

from typing import Any

import pytest
from _core_fakes import Batch
from sc_core import (
    ClassWithInitArgs,
    ConfigTypeError,
    InvalidConfigError,
    LocalWorkerGroup,
    ResourcePool,
    Worker,
    WorkerDiedError,
    WorkerError,
    create_colocated_worker_cls,
)
from sc_core.backend import BackendNotImplementedError
from sc_dispatch import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from sc_dispatch.ext import MeshLayout

#: mesh "m" of a 3-rank Node group: one dp group, rank 0 collecting
MESH_M = MeshLayout((0, 0, 0), (True, False, False))
#: (rank, replaced) of every on_group_reformed call, in order
REFORMED: list[tuple[int, list[int]]] = []
#: ranks whose next construction fails
FAIL_INIT: set[int] = set()


class Node(Worker):
    def __init__(self, tag: str = "n") -> None:
        super().__init__()
        if self.rank in FAIL_INIT:
            raise RuntimeError(f"cannot start rank {self.rank}")
        self.tag = tag
        self.calls = 0
        self.collective_up = True
        # one dp group of every rank, rank 0 collecting
        self._register_dispatch_collect_info("m", dp_rank=0, is_collect=self.rank == 0)

    def on_group_reformed(self, replaced: list[int]) -> None:
        REFORMED.append((self.rank, replaced))
        self.collective_up = False

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self) -> tuple[int, int, str | None, str | None, int]:
        self.calls += 1
        addr, port = self.get_master_addr_port()
        return self.rank, self.world_size, addr, port, id(self)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, batch: Batch) -> Batch:
        return Batch([2 * r for r in batch.rows])

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="m"))
    def by_mesh(self, batch: Batch) -> Batch:
        return Batch([(self.rank, r) for r in batch.rows])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def up(self) -> bool:
        return self.collective_up


@pytest.fixture(autouse=True)
def _reset() -> None:
    REFORMED.clear()
    FAIL_INIT.clear()


def _group(n: int = 3) -> LocalWorkerGroup:
    return LocalWorkerGroup(ResourcePool([n]), ClassWithInitArgs(Node, tag="t"))


def test_a_dead_rank_is_replaced_and_the_group_works_again() -> None:
    with _group() as wg:
        before = wg.whoami()
        old_ports = {port for _, _, _, port, _ in before}
        assert wg.by_mesh(Batch([7, 8])).rows == [(0, 7), (0, 8)]  # rank 0 collects
        assert wg._mesh_cache.layouts() == {"m": MESH_M}
        wg.kill_worker(1)
        with pytest.raises(WorkerDiedError, match="rank 1 died"):
            wg.whoami()
        workers = wg.workers
        assert wg.replace_ranks() == [1]
        assert wg.dead_ranks == []
        after = wg.whoami()
        # same identity, a new object, one new rendezvous address shared by every rank
        assert [(r, w) for r, w, *_ in after] == [(0, 3), (1, 3), (2, 3)]
        assert after[1][4] != before[1][4]
        assert [a[4] for a in after[::2]] == [b[4] for b in before[::2]]
        assert len({(a[2], a[3]) for a in after}) == 1
        assert after[0][3] not in old_ports
        assert wg.workers[1] is not workers[1]
        assert wg.workers[1].tag == "t"
        # every rank ran the hook once, told which ranks were replaced
        assert sorted(REFORMED) == [(0, [1]), (1, [1]), (2, [1])]
        assert wg.up() == [False, False, False]
        # the group read the mesh tables again (the new worker registered its own)
        assert wg._mesh_cache.layouts() == {}
        assert wg.by_mesh(Batch([7, 8])).rows == [(0, 7), (0, 8)]
        assert wg._mesh_cache.layouts() == {"m": MESH_M}
        assert wg.double(Batch([1, 2, 3, 4, 5, 6])) == Batch([2, 4, 6, 8, 10, 12])


def test_live_ranks_can_be_replaced_on_request_and_nothing_to_do_is_empty() -> None:
    with _group(2) as wg:
        assert wg.replace_ranks() == []
        assert REFORMED == []
        ids = [w[4] for w in wg.whoami()]
        assert wg.replace_ranks([0, 0]) == [0]
        new = [w[4] for w in wg.whoami()]
        assert new[0] != ids[0]
        assert new[1] == ids[1]


def test_a_failed_start_leaves_the_rank_dead_and_a_later_try_works() -> None:
    with _group(2) as wg:
        wg.kill_worker(0)
        FAIL_INIT.add(0)
        with pytest.raises(WorkerError, match="cannot start rank 0"):
            wg.replace_ranks()
        assert wg.dead_ranks == [0]
        with pytest.raises(WorkerDiedError):
            wg.whoami()
        assert REFORMED == []
        FAIL_INIT.clear()
        assert wg.replace_ranks() == [0]
        assert [w[0] for w in wg.whoami()] == [0, 1]


class Actor(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> tuple[str, int]:
        return ("actor", self.rank)

    def on_group_reformed(self, replaced: list[int]) -> None:
        REFORMED.append((self.rank, replaced))


class Critic(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> tuple[str, int]:
        return ("critic", self.rank)

    def on_group_reformed(self, replaced: list[int]) -> None:
        REFORMED.append((10 + self.rank, replaced))


def test_spawned_views_of_a_colocated_group_keep_working() -> None:
    cia = create_colocated_worker_cls(
        {"actor": ClassWithInitArgs(Actor), "critic": ClassWithInitArgs(Critic)}
    )
    with LocalWorkerGroup(ResourcePool([2]), cia) as wg:
        views: dict[str, Any] = wg.spawn({"actor", "critic"})
        wg.kill_worker(1)
        with pytest.raises(WorkerDiedError):
            views["critic"].describe()
        assert views["critic"].replace_ranks() == [1]  # through a view: the whole group
        assert views["actor"].describe() == [("actor", 0), ("actor", 1)]
        assert views["critic"].describe() == [("critic", 0), ("critic", 1)]
        # each role instance of every rank ran its hook
        assert sorted(REFORMED) == [(0, [1]), (1, [1]), (10, [1]), (11, [1])]


def test_replace_ranks_errors() -> None:
    with _group(2) as wg:
        with pytest.raises(InvalidConfigError, match=r"ranks \[2\] are outside .* world size 2"):
            wg.replace_ranks([2])
        with pytest.raises(ConfigTypeError, match=r"ranks must be ints, got \[True\]"):
            wg.replace_ranks([True])
        with pytest.raises(ConfigTypeError, match="ranks must be an iterable of ints"):
            wg.replace_ranks("1")  # type: ignore[arg-type]
        with pytest.raises(InvalidConfigError, match="timeout"):
            wg.replace_ranks([0], timeout=-1)


def test_a_backend_that_cannot_replace_says_so() -> None:
    class Plain:
        """Every Backend method, no replace."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "replace":
                raise AttributeError(name)
            return getattr(self._inner, name)

        def start(self, *a: Any) -> Any:
            return self._inner.start(*a)

        def wait(self, *a: Any) -> Any:
            return self._inner.wait(*a)

        def pending(self, *a: Any) -> Any:
            return self._inner.pending(*a)

        def is_done(self, *a: Any) -> Any:
            return self._inner.is_done(*a)

        def cancel(self, *a: Any) -> Any:
            return self._inner.cancel(*a)

        def is_alive(self, *a: Any) -> Any:
            return self._inner.is_alive(*a)

        def close(self) -> None:
            self._inner.close()

    with _group(2) as wg:
        wg._sc_runtime.backend = Plain(wg._sc_runtime.backend)
        with pytest.raises(BackendNotImplementedError, match="cannot replace workers"):
            wg.replace_ranks([0])
