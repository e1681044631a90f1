"""Streamed calls, the load-balanced mode and sticky routing on the in-process backend.

Streams yield every row exactly once (padding dropped), in completion or input order, end
with the blocking call's typed errors, and join to the blocking call's result; the
load-balanced mode returns exactly the even split's result for any batch, micro-shard and
world size (a 2-D mesh included) while fast ranks pull more micro-shards; sticky routing
keeps keys on their rank and moves them when a rank dies or falls behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _core_fakes import PROPERTY, Batch, group, make_group
from hypothesis import given
from hypothesis import strategies as st
from sc_core import (
    CallTimeoutError,
    ConfigTypeError,
    LocalWorkerGroup,
    SpanRecorder,
    UnsupportedCallError,
    Worker,
    WorkerDiedError,
    WorkerError,
)
from sc_dispatch import (
    Dispatch,
    DispatchArgumentError,
    InvalidDispatchModeError,
    make_balanced_dispatch_fn,
    make_nd_compute_dataproto_dispatch_fn,
    make_sticky_dispatch_fn,
    register,
)


class RowWorker(Worker):
    """Squares rows, sleeping ``base`` seconds per row (``delay`` on rank ``slow_rank``); a
    row ``"fail"`` raises, a row ``"hang"`` waits for ``release``."""

    def __init__(self, slow_rank: int = -1, delay: float = 0.0, base: float = 0.0) -> None:
        super().__init__()
        self.slow = self.rank == slow_rank
        self.delay = delay if self.slow else base
        self.units: list[list[Any]] = []
        self.release = threading.Event()

    def _work(self, batch: Batch) -> Batch:
        self.units.append(list(batch.rows))
        if self.delay:
            time.sleep(self.delay * len(batch.rows))
        for row in batch.rows:
            if row == "fail":
                raise ValueError(f"rank {self.rank} cannot square {row!r}")
            if row == "hang":
                self.release.wait(10)
        return Batch([row * row for row in batch.rows])

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def even(self, batch: Batch) -> Batch:
        return self._work(batch)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_BALANCED)
    def balanced(self, batch: Batch) -> Batch:
        return self._work(batch)

    @register(dispatch_mode=make_balanced_dispatch_fn(2))
    def balanced_by_two(self, batch: Batch) -> Batch:
        return self._work(batch)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def everywhere(self) -> int:
        return self.rank


@pytest.fixture(scope="module")
def wg() -> Iterator[LocalWorkerGroup]:
    with group((4,), RowWorker) as g:
        yield g


@pytest.fixture(autouse=True)
def _reset(wg: LocalWorkerGroup) -> None:
    for worker in wg.workers:
        worker.units.clear()


def _rows_seen(items: list[tuple[Any, Batch]]) -> list[int]:
    return sorted(r for rows, _ in items for r in rows)


# --------------------------------------------------------------------------- streaming


def test_a_stream_yields_every_row_once_with_its_output(wg: LocalWorkerGroup) -> None:
    items = list(wg.even.stream(Batch(range(8))))
    assert len(items) == 4
    assert _rows_seen(items) == list(range(8))
    for rows, shard in items:
        assert shard.rows == [r * r for r in rows]


def test_a_stream_drops_padding_rows(wg: LocalWorkerGroup) -> None:
    """5 rows on 4 ranks pad to 8: the padded shard is trimmed, the all-padding one skipped."""
    items = list(wg.even.stream(Batch(range(5))))
    assert _rows_seen(items) == [0, 1, 2, 3, 4]
    assert sum(len(s.rows) for _, s in items) == 5


def test_a_stream_joins_to_the_blocking_result(wg: LocalWorkerGroup) -> None:
    stream = wg.even.stream(Batch(range(7)))
    first = next(iter(stream))
    assert len(first[1].rows) > 0
    assert stream.result() == wg.even(Batch(range(7))) == Batch([r * r for r in range(7)])


def test_completion_order_and_input_order() -> None:
    """Rank 0 is slow: in completion order its shard comes last, in input order first."""
    with group((2,), RowWorker, 0, 0.05, concurrent=True) as slow:
        items = list(slow.even.stream(Batch(range(4))))
        assert [list(rows) for rows, _ in items] == [[2, 3], [0, 1]]
        ordered = list(slow.even.options(in_order=True).stream(Batch(range(4))))
        assert [list(rows) for rows, _ in ordered] == [[0, 1], [2, 3]]


def test_a_worker_error_ends_the_stream_with_the_typed_error(wg: LocalWorkerGroup) -> None:
    with SpanRecorder() as rec, pytest.raises(WorkerError, match="cannot square") as info:
        list(wg.even.stream(Batch([1, 2, "fail", 4])))
    assert isinstance(info.value, ValueError)
    assert info.value.rank == 2
    (span,) = rec.spans
    assert span.error is not None
    assert span.method == "even"


def test_a_dead_rank_ends_the_stream_with_worker_died_error() -> None:
    with group((2,), RowWorker) as g:
        g.kill_worker(1)
        with pytest.raises(WorkerDiedError, match="rank 1"):
            list(g.even.stream(Batch(range(4))))
        assert g.dead_ranks == [1]


def test_a_stream_keeps_the_call_deadline() -> None:
    with group((2,), RowWorker, concurrent=True) as g:
        stream = g.even.options(timeout=0.3).stream(Batch(["hang", 1, 2, 3]))
        with pytest.raises(CallTimeoutError, match="rank 0"):
            list(stream)
        g.workers[0].release.set()


def test_a_stream_records_one_span_with_every_unit(wg: LocalWorkerGroup) -> None:
    with SpanRecorder() as rec:
        list(wg.balanced_by_two.stream(Batch(range(8))))
    (span,) = rec.spans
    assert span.error is None
    assert span.end is not None
    executes = [p for p in span.phases if p.name == "execute" and p.rank is not None]
    assert len(executes) == 4  # four micro-shards of two rows


def test_closing_a_stream_early_stops_waiting(wg: LocalWorkerGroup) -> None:
    with wg.balanced_by_two.stream(Batch(range(8))) as stream:
        rows, _ = next(iter(stream))
        assert len(rows) == 2
    assert list(stream) == []
    with pytest.raises(UnsupportedCallError, match="closed before its end"):
        stream.result()
    assert wg.even(Batch(range(4))) == Batch([0, 1, 4, 9])  # the group still works


def test_streaming_a_mode_without_units_is_refused(wg: LocalWorkerGroup) -> None:
    with pytest.raises(UnsupportedCallError, match="everywhere: stream needs"):
        wg.everywhere.stream()
    with pytest.raises(ConfigTypeError, match="in_order must be a bool"):
        wg.even.options(in_order="yes")


def test_a_stream_of_an_unsplittable_batch_names_the_method(wg: LocalWorkerGroup) -> None:
    with pytest.raises(DispatchArgumentError, match=r"LocalWorkerGroup\.even: .*empty batch"):
        wg.even.stream(Batch([]))


# ------------------------------------------------------------------------ load balanced


def test_balanced_returns_the_even_result_in_input_order(wg: LocalWorkerGroup) -> None:
    balanced = wg.balanced(Batch(range(13)))
    # 13 rows over 4 ranks: the default is 4 micro-shards per rank, here of one row each
    assert sorted(len(u) for w in wg.workers for u in w.units) == [1] * 13
    assert balanced == wg.even(Batch(range(13))) == Batch([r * r for r in range(13)])


def test_balanced_micro_shards_are_pulled_by_free_ranks() -> None:
    """Rank 0 is 20x slower per row: it takes fewer micro-shards than any other rank."""
    with group((4,), RowWorker, 0, 0.1, 0.005, concurrent=True) as g:
        out = g.balanced_by_two(Batch(range(32)))
        assert out == Batch([r * r for r in range(32)])
        taken = [len(w.units) for w in g.workers]
        assert sum(taken) == 16
        assert taken[0] < min(taken[1:]), taken


class LaterWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_BALANCED, blocking=False)
    def later(self, batch: Batch) -> Batch:
        return batch


def test_a_balanced_mode_has_no_non_blocking_form(wg: LocalWorkerGroup) -> None:
    with pytest.raises(UnsupportedCallError, match="no non-blocking form"):
        wg.balanced.options(blocking=False)(Batch(range(4)))
    with group((2,), LaterWorker) as g:
        with pytest.raises(UnsupportedCallError, match="later: DP_COMPUTE_PROTO_BALANCED"):
            g.later(Batch(range(4)))
        assert g.later.options(blocking=True)(Batch(range(4))) == Batch(range(4))


def test_bad_balanced_and_sticky_settings_are_refused() -> None:
    with pytest.raises(DispatchArgumentError, match="micro_shard_size must be a positive int"):
        make_balanced_dispatch_fn(0)
    with pytest.raises(InvalidDispatchModeError, match="mesh_name"):
        make_balanced_dispatch_fn(mesh_name="")
    with pytest.raises(InvalidDispatchModeError, match="max_lag must be a non-negative"):
        make_sticky_dispatch_fn("sid", max_lag=-1)
    with pytest.raises(InvalidDispatchModeError, match="key must be"):
        make_sticky_dispatch_fn("")


class ModeWorker(Worker):
    """One row-wise method under the even split and under balanced modes of several sizes."""

    def _rows(self, batch: Batch) -> Batch:
        return Batch([(row, row * 3) for row in batch.rows])

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def even(self, batch: Batch) -> Batch:
        return self._rows(batch)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_BALANCED)
    def b_default(self, batch: Batch) -> Batch:
        return self._rows(batch)

    @register(dispatch_mode=make_balanced_dispatch_fn(1))
    def b1(self, batch: Batch) -> Batch:
        return self._rows(batch)

    @register(dispatch_mode=make_balanced_dispatch_fn(3))
    def b3(self, batch: Batch) -> Batch:
        return self._rows(batch)

    @register(dispatch_mode=make_balanced_dispatch_fn(5))
    def b5(self, batch: Batch) -> Batch:
        return self._rows(batch)


@pytest.fixture(scope="module")
def mode_groups() -> Iterator[dict[int, LocalWorkerGroup]]:
    groups = {world: make_group((world,), ModeWorker) for world in (1, 2, 3, 4)}
    yield groups
    for g in groups.values():
        g.close()


@PROPERTY
@given(
    world=st.integers(1, 4),
    rows=st.integers(1, 30),
    method=st.sampled_from(["b_default", "b1", "b3", "b5"]),
)
def test_balanced_equals_even_for_any_sizes(
    mode_groups: dict[int, LocalWorkerGroup], world: int, rows: int, method: str
) -> None:
    """Batches that the even split pads (auto-padding) and micro-shard sizes that do not
    divide the batch: the balanced result is the even result, row for row, and its stream
    yields every row once."""
    g = mode_groups[world]
    batch = Batch(range(rows))
    balanced = getattr(g, method)
    assert balanced(batch) == g.even(batch)
    assert _rows_seen(list(balanced.stream(batch))) == list(range(rows))


class MeshWorker(Worker):
    """tp=2 x dp=2: ranks 0,1 are dp group 0, ranks 2,3 dp group 1; tp rank 0 collects."""

    def __init__(self) -> None:
        super().__init__()
        self._register_dispatch_collect_info("m", self.rank // 2, self.rank % 2 == 0)
        self.units: list[list[Any]] = []

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("m"))
    def even(self, batch: Batch) -> Batch:
        self.units.append(list(batch.rows))
        return Batch([(row, row + 1) for row in batch.rows])

    @register(dispatch_mode=make_balanced_dispatch_fn(3, mesh_name="m"))
    def balanced(self, batch: Batch) -> Batch:
        return self.even(batch)

    @register(dispatch_mode=make_balanced_dispatch_fn(1, mesh_name="m"))
    def balanced_1(self, batch: Batch) -> Batch:
        return self.even(batch)

    @register(dispatch_mode=make_balanced_dispatch_fn(mesh_name="m"))
    def balanced_default(self, batch: Batch) -> Batch:
        return self.even(batch)


@pytest.fixture(scope="module")
def mesh_group() -> Iterator[LocalWorkerGroup]:
    with group((4,), MeshWorker) as g:
        yield g


@PROPERTY
@given(
    rows=st.integers(1, 30), method=st.sampled_from(["balanced", "balanced_1", "balanced_default"])
)
def test_balanced_on_a_2d_mesh_equals_the_even_split(
    mesh_group: LocalWorkerGroup, rows: int, method: str
) -> None:
    """Any batch size (the even split pads odd ones) and micro-shard size: the same rows, in
    order; tp peers receive the same micro-shards."""
    for w in mesh_group.workers:
        w.units.clear()
    batch = Batch(range(rows))
    out = getattr(mesh_group, method)(batch)
    units = [w.units for w in mesh_group.workers]
    assert units[0] == units[1]
    assert units[2] == units[3]
    assert out == mesh_group.even(batch)


def test_balanced_on_a_2d_mesh_sends_each_micro_shard_to_a_whole_dp_group() -> None:
    with group((4,), MeshWorker) as g:
        even = g.even(Batch(range(11)))
        for w in g.workers:
            w.units.clear()
        assert g.balanced(Batch(range(11))) == even
        units = [w.units for w in g.workers]
        assert units[0] == units[1]
        assert units[2] == units[3]
        assert sorted(r for u in units[0] + units[2] for r in u) == list(range(11))
        assert all(len(u) <= 3 for u in units[0] + units[2])
        streamed = list(g.even.stream(Batch(range(11))))
        assert _rows_seen(streamed) == list(range(11))


# ------------------------------------------------------------------------------- sticky


class SessionWorker(Worker):
    """Remembers the sessions it served; rows are ``(session, turn)`` pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.sessions: set[str] = set()

    @register(dispatch_mode=make_sticky_dispatch_fn(lambda b: [s for s, _ in b.rows], max_lag=2))
    def turn(self, batch: Batch) -> Batch:
        self.sessions.update(s for s, _ in batch.rows)
        return Batch([(s, t, self.rank) for s, t in batch.rows])


def _owners(out: Batch) -> dict[str, int]:
    return {s: rank for s, _, rank in out.rows}


def test_sticky_keeps_each_key_on_its_rank_and_returns_input_order() -> None:
    with group((3,), SessionWorker) as g:
        sessions = [f"s{i}" for i in range(6)]
        first = g.turn(Batch([(s, 0) for s in sessions]))
        assert [(s, t) for s, t, _ in first.rows] == [(s, 0) for s in sessions]
        owners = _owners(first)
        assert sorted(owners.values()) == [0, 0, 1, 1, 2, 2]
        for turn in (1, 2, 3):
            shuffled = sessions[turn:] + sessions[:turn]
            out = g.turn(Batch([(s, turn) for s in shuffled]))
            assert [s for s, _, _ in out.rows] == shuffled
            assert _owners(out) == owners


def test_a_sticky_mode_has_no_non_blocking_form_and_starts_nothing() -> None:
    """Its router must hear when each unit finishes: a non-blocking call is refused before
    any rank starts, and the rows it routed are no one's to do."""
    with group((2,), SessionWorker) as g:
        with pytest.raises(
            UnsupportedCallError, match=r"turn: sticky_dispatch_fn.*no non-blocking"
        ):
            g.turn.options(blocking=False)(Batch([("a", 0), ("b", 0)]))
        assert [w.sessions for w in g.workers] == [set(), set()]
        assert next(iter(g._sc_key_affinities.values())).outstanding == [0, 0]


def test_sticky_moves_the_keys_of_a_dead_rank_only() -> None:
    with group((3,), SessionWorker) as g:
        batch = Batch([(f"s{i}", 0) for i in range(6)])
        owners = _owners(g.turn(batch))
        g.kill_worker(1)
        with pytest.raises(WorkerDiedError, match="rank 1"):
            g.turn(batch)
        moved = _owners(g.turn(batch))
        for session, rank in owners.items():
            if rank == 1:
                assert moved[session] in (0, 2)
            else:
                assert moved[session] == rank
        assert sorted(moved.values()).count(1) == 0


def test_sticky_moves_keys_off_a_rank_that_falls_behind() -> None:
    """A stream still running on rank 0 counts as rows it has to do: once that exceeds
    max_lag (2 rows) beyond rank 1's, rank 0's keys move; rank 1's keys stay."""
    with group((2,), SessionWorker) as g:
        owners = _owners(g.turn(Batch([("a", 0), ("b", 0)])))
        assert owners == {"a": 0, "b": 1}
        backlog = g.turn.stream(Batch([("a", 1)] * 5 + [("b", 1)]))  # 5 rows on rank 0
        router = next(iter(g._sc_key_affinities.values()))
        assert router.outstanding == [5, 1]
        moved = _owners(g.turn(Batch([("a", 2), ("b", 2)])))
        assert moved == {"a": 1, "b": 1}
        assert router.moves == 1
        assert len(backlog.result().rows) == 6
        assert router.outstanding == [0, 0]
        assert _owners(g.turn(Batch([("a", 3), ("b", 3)]))) == {"a": 1, "b": 1}  # it stays


def test_sticky_without_a_key_column_names_it() -> None:
    class Keyed(Worker):
        @register(dispatch_mode=make_sticky_dispatch_fn("sid"))
        def turn(self, batch: Batch) -> Batch:
            return batch

    with group((2,), Keyed) as g, pytest.raises(DispatchArgumentError, match="'sid'"):
        g.turn(Batch([1, 2]))


def _sessions(b: Batch) -> list[str]:
    return [s for s, _ in b.rows]


class TwoSticky(Worker):
    """Two sticky modes on the same key, one that never lets a key wait (max_lag=0) and one
    that practically never moves it; ``stay_put`` is called first."""

    @register(dispatch_mode=make_sticky_dispatch_fn(_sessions, max_lag=1000))
    def stay_put(self, batch: Batch) -> Batch:
        return Batch([(s, t, self.rank) for s, t in batch.rows])

    @register(dispatch_mode=make_sticky_dispatch_fn(_sessions, max_lag=0))
    def eager(self, batch: Batch) -> Batch:
        return Batch([(s, t, self.rank) for s, t in batch.rows])


def test_two_sticky_modes_on_one_key_keep_their_own_router_and_max_lag() -> None:
    with group((2,), TwoSticky) as g:
        assert _owners(g.stay_put(Batch([("a", 0), ("b", 0)]))) == {"a": 0, "b": 1}
        assert _owners(g.eager(Batch([("a", 0), ("b", 0)]))) == {"a": 0, "b": 1}
        assert len(g._sc_key_affinities) == 2
        # 2 rows of "a" in flight on rank 0 under each mode: rank 0 is 2 rows behind.
        backlogs = [
            g.stay_put.stream(Batch([("a", 1), ("a", 2)])),
            g.eager.stream(Batch([("a", 1), ("a", 2)])),
        ]
        assert _owners(g.stay_put(Batch([("a", 3)]))) == {"a": 0}  # max_lag 1000: stays
        assert _owners(g.eager(Batch([("a", 3)]))) == {"a": 1}  # max_lag 0: moves
        for backlog in backlogs:
            assert len(backlog.result().rows) == 2


def test_a_sticky_stream_of_an_empty_batch_is_refused_up_front() -> None:
    with group((2,), SessionWorker) as g:
        with pytest.raises(DispatchArgumentError, match=r"cannot route an empty batch \(0 rows\)"):
            g.turn.stream(Batch([]))
        with pytest.raises(DispatchArgumentError, match=r"cannot route an empty batch"):
            g.turn(Batch([]))
        assert g.turn(Batch([("a", 0)])).rows == [("a", 0, 0)]  # nothing was left routed
        assert next(iter(g._sc_key_affinities.values())).outstanding == [0, 0]
