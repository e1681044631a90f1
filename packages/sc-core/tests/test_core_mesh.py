"""Mesh registration on workers and N-d dispatch end to end (tp=2 x dp=2)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _core_fakes import Batch, group
from sc_core import LocalWorkerGroup, MeshRegistrationError, UnknownMeshError, Worker, WorkerError
from sc_core.backend import worker_context
from sc_dispatch import Dispatch, MeshLayoutError, make_nd_compute_dataproto_dispatch_fn, register
from sc_dispatch.ext import DispatchWorkerGroup, MeshLayout


class TpDpWorker(Worker):
    """tp=2 x dp=2: ranks 0,1 form dp group 0 and ranks 2,3 dp group 1; tp rank 0 collects."""

    def __init__(self) -> None:
        super().__init__()
        self.tp_rank = self.rank % 2
        self.dp_rank = self.rank // 2
        self._register_dispatch_collect_info("actor", self.dp_rank, self.tp_rank == 0)
        self.received: list[list[int]] = []

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def forward(self, batch: Batch) -> Batch:
        self.received.append(list(batch.rows))
        return Batch([(self.rank, row) for row in batch.rows])

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"))
    def on_unregistered_mesh(self, batch: Batch) -> Batch:  # pragma: no cover - never runs
        return batch

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def register_again(self, mesh: str, dp: int, collect: bool) -> None:
        self._register_dispatch_collect_info(mesh, dp, collect)


@pytest.fixture
def wg() -> Iterator[LocalWorkerGroup]:
    with group((4,), TpDpWorker) as g:
        yield g


def test_query_info_returns_one_value_per_rank(wg: LocalWorkerGroup) -> None:
    assert wg._query_dispatch_info("actor") == [0, 0, 1, 1]
    assert wg._query_collect_info("actor") == [True, False, True, False]


def test_nd_dispatch_splits_by_dp_rank_and_collects_from_collect_ranks(
    wg: LocalWorkerGroup,
) -> None:
    out = wg.forward(Batch(range(4)))
    assert out == Batch([(0, 0), (0, 1), (2, 2), (2, 3)])
    assert [w.received for w in wg.workers] == [[[0, 1]], [[0, 1]], [[2, 3]], [[2, 3]]]
    assert wg._mesh_cache.layouts() == {"actor": MeshLayout.from_sizes(2, 2)}
    assert wg.query_mesh("actor") == MeshLayout.from_sizes(2, 2)


def test_nd_dispatch_pads_to_the_dp_size_and_unpads(wg: LocalWorkerGroup) -> None:
    out = wg.forward(Batch(range(3)))
    assert [row for _, row in out.rows] == [0, 1, 2]
    assert wg.workers[2].received == [[2, 0]]


def test_nd_dispatch_asks_the_workers_once_per_mesh(wg: LocalWorkerGroup) -> None:
    wg.forward(Batch(range(4)))
    # the cache is used, no second query: a layout the workers never registered is followed
    wg._mesh_cache.put("actor", MeshLayout((0, 0, 0, 0), (False, False, True, False)))
    out = wg.forward(Batch(range(4)))
    assert out == Batch([(2, 0), (2, 1), (2, 2), (2, 3)])
    assert wg.workers[3].received[-1] == [0, 1, 2, 3]


def test_unregistered_mesh_is_reported_on_the_driver_naming_the_mesh(wg: LocalWorkerGroup) -> None:
    """Not a WorkerError wrapping every rank's failure: one ValueError on the driver."""
    with pytest.raises(MeshLayoutError) as info:
        wg.on_unregistered_mesh(Batch(range(4)))
    err = info.value
    assert isinstance(err, ValueError)
    assert not isinstance(err, WorkerError)
    assert "on_unregistered_mesh" in str(err)
    assert "no rank registered the mesh 'critic'" in str(err)
    assert "critic" not in wg._mesh_cache.layouts()  # nothing invalid is cached


def test_query_collect_info_in_the_worker_still_raises_for_unknown_meshes() -> None:
    worker = _bare_worker()
    with pytest.raises(KeyError, match=r"mesh 'nope' was never registered"):
        worker.query_collect_info("nope")


@pytest.mark.parametrize("query", ["_query_dispatch_info", "_query_collect_info"])
def test_a_workers_query_of_an_unregistered_mesh_is_a_key_error_naming_it(query: str) -> None:
    # verl fails an assertion in the worker; sc raises UnknownMeshError (a KeyError).
    worker = _bare_worker()
    worker._register_dispatch_collect_info("actor", 0, True)
    with pytest.raises(UnknownMeshError) as info:
        getattr(worker, query)("critic")
    assert isinstance(info.value, KeyError)
    text = str(info.value)
    assert f"Worker.{query} (rank 1): mesh 'critic' was never registered" in text
    assert "registered meshes: ['actor']" in text
    assert worker._query_dispatch_info("actor") == 0
    assert worker._query_collect_info("actor") is True


class HalfRegisteredWorker(Worker):
    """Only the even ranks register the mesh."""

    def __init__(self) -> None:
        super().__init__()
        if self.rank % 2 == 0:
            self._register_dispatch_collect_info("actor", self.rank // 2, True)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def forward(self, batch: Batch) -> Batch:  # pragma: no cover - never runs
        return batch


def test_a_mesh_some_ranks_did_not_register_names_those_ranks_on_the_driver() -> None:
    with group((4,), HalfRegisteredWorker) as g:
        with pytest.raises(MeshLayoutError) as info:
            g.forward(Batch(range(4)))
        assert "ranks [1, 3] did not register the mesh 'actor'" in str(info.value)
        assert "mesh 'actor' was never registered; registered meshes: []" in str(info.value)
        assert "actor" not in g._mesh_cache.layouts()


def test_query_mesh_asks_the_workers_once_and_names_unregistered_ranks() -> None:
    expected = r"ranks \[1, 3\] did not register the mesh"
    with group((4,), HalfRegisteredWorker) as g, pytest.raises(MeshLayoutError, match=expected):
        g.query_mesh("actor")
    with group((4,), TpDpWorker) as g:
        first = g.query_mesh("actor")
        assert first == MeshLayout.from_sizes(2, 2)
        assert first.mesh_name == "actor"
        assert g.query_mesh("actor") is first  # cached: the workers are asked once
        assert isinstance(g, DispatchWorkerGroup)


def test_registering_a_mesh_twice_is_an_error(wg: LocalWorkerGroup) -> None:
    with pytest.raises(WorkerError, match=r"MeshRegistrationError.*'actor' is already registered"):
        wg.register_again("actor", 0, True)


def _bare_worker() -> Worker:
    with worker_context({"WORLD_SIZE": "2", "RANK": "1"}):
        return Worker()


def test_registration_arguments_are_checked() -> None:
    w = _bare_worker()
    for args, match in (
        (("", 0, True), "mesh_name must be a non-empty str"),
        (("m", -1, True), "dp_rank for mesh 'm' must be an int >= 0"),
        (("m", True, True), "dp_rank"),
        (("m", 0, 1), "is_collect for mesh 'm' must be a bool"),
    ):
        with pytest.raises(MeshRegistrationError, match=match) as info:
            w._register_dispatch_collect_info(*args)  # type: ignore[arg-type]
        assert "rank 1" in str(info.value)


def test_query_collect_info_and_unknown_mesh_in_the_worker() -> None:
    w = _bare_worker()
    w._register_dispatch_collect_info("m", 3, False)
    assert w.query_collect_info("m") is False
    assert w._query_dispatch_info("m") == 3
    assert w._query_collect_info("m") is False
    with pytest.raises(UnknownMeshError, match=r"rank 1\): mesh 'x' was never registered") as i:
        w.query_collect_info("x")
    assert isinstance(i.value, KeyError)
    assert not str(i.value).startswith("'")  # the message, not its repr


def test_get_and_set_dispatch_collect_copy_registrations() -> None:
    source = _bare_worker()
    source._register_dispatch_collect_info("engine", 1, True)
    tables = source.get_dispatch_collect()
    assert tables == {
        "dispatch_dp_rank": {"engine": 1},
        "collect_dp_rank": {"engine": True},
        "receives_data": {"engine": True},
    }
    tables["dispatch_dp_rank"]["engine"] = 9  # a copy: the worker's table is unchanged
    assert source.get_dispatch_collect()["dispatch_dp_rank"] == {"engine": 1}

    target = _bare_worker()
    target.set_dispatch_collect("actor", {"engine": 1}, {"engine": True})  # single entry
    target.set_dispatch_collect("engine", {"engine": 1, "x": 0}, {"engine": True, "x": False})
    assert target.get_dispatch_collect() == {
        "dispatch_dp_rank": {"actor": 1, "engine": 1},
        "collect_dp_rank": {"actor": True, "engine": True},
        "receives_data": {"actor": True, "engine": True},
    }
    with pytest.raises(MeshRegistrationError, match="not exactly one entry"):
        target.set_dispatch_collect("other", {"a": 0, "b": 1}, {"a": True, "b": False})
    with pytest.raises(MeshRegistrationError, match="already registered"):
        target.set_dispatch_collect("actor", {"actor": 0}, {"actor": True})


class NoSuperInit(Worker):
    def __init__(self) -> None:  # skips Worker.__init__ on purpose
        pass


def test_a_worker_that_skipped_worker_init_can_still_register() -> None:
    with worker_context({"WORLD_SIZE": "1", "RANK": "0"}):
        w = NoSuperInit()
    w._register_dispatch_collect_info("m", 0, True)
    assert w.get_dispatch_collect() == {
        "dispatch_dp_rank": {"m": 0},
        "collect_dp_rank": {"m": True},
        "receives_data": {"m": True},
    }
    with pytest.raises(MeshRegistrationError, match="rank unknown"):
        w._register_dispatch_collect_info("m", 0, True)


def test_verl_get_set_dispatch_collect_round_trip_with_keyword_unpacking() -> None:
    """verl's own test, through sc: adopt other workers' layouts under new mesh names."""
    ref = _bare_worker()
    ref._register_dispatch_collect_info(mesh_name="actor", dp_rank=0, is_collect=True)
    actor = _bare_worker()
    actor._register_dispatch_collect_info(mesh_name="actor", dp_rank=1, is_collect=False)
    combined = _bare_worker()
    combined.set_dispatch_collect(mesh_name="ref", **ref.get_dispatch_collect())
    combined.set_dispatch_collect(mesh_name="actor", **actor.get_dispatch_collect())
    assert combined._query_dispatch_info("ref") == 0
    assert combined._query_collect_info("ref") is True
    assert combined._query_dispatch_info("actor") == 1
    assert combined._query_collect_info("actor") is False
    again = _bare_worker()
    again._register_dispatch_collect_info(mesh_name="actor", dp_rank=1, is_collect=False)
    with pytest.raises(ValueError, match="'actor' is already registered"):
        combined.set_dispatch_collect(mesh_name="actor", **again.get_dispatch_collect())
