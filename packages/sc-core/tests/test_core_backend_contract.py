"""A minimal backend written from the contract alone, and dead-worker reporting through it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from _core_fakes import Batch, EchoWorker
from sc_core import (
    Call,
    CallTimeoutError,
    ClassWithInitArgs,
    InvalidCallOptionsError,
    LazyFuture,
    LocalWorkerGroup,
    ResourcePool,
    SpanRecorder,
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
    WorkerGroupError,
    current_call,
    worker_context,
)


class ListBackend(WorkerGroup):
    """Runs each call at once, storing ("ok", value) / ("error", exc) / ("dead", None)."""

    def __init__(self, n: int) -> None:
        super().__init__(ResourcePool([n]), name_prefix="listbackend")
        self.alive = [True] * n
        self.pending_ranks: set[int] = set()
        for rank in range(n):
            with worker_context({"WORLD_SIZE": str(n), "RANK": str(rank)}):
                self._workers.append(EchoWorker())
        self._bind_worker_method(EchoWorker)

    def _execute_rank_async(
        self, rank: int, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        call = current_call()
        if call is not None:
            call.span.add_bytes(put=10)
        if not self.alive[rank]:
            return ("dead", rank, None)
        if rank in self.pending_ranks:
            return ("pending", rank, None)
        try:
            return ("ok", rank, getattr(self._workers[rank], method_name)(*args, **kwargs))
        except Exception as exc:
            return ("error", rank, exc)

    def _wait(self, handles: Sequence[Any], call: Call) -> list[Any]:
        pending = [r for kind, r, _ in handles if kind == "pending"]
        if pending:
            raise CallTimeoutError(call.method_name, pending, call.timeout)
        dead = [r for kind, r, _ in handles if kind == "dead"]
        if dead:
            self._mark_workers_dead(dead, "actor died")
            raise WorkerDiedError(call.method_name, dead, "actor died")
        errors = [(r, e) for kind, r, e in handles if kind == "error"]
        if errors:
            raise WorkerError.from_exception(
                call.method_name,
                errors[0][0],
                errors[0][1],
                other_failed_ranks=[r for r, _ in errors[1:]],
            )
        call.span.add_bytes(fetched=5 * len(handles))
        return [value for _, _, value in handles]

    def _is_worker_alive(self, worker: Any) -> bool:
        return self.alive[self._workers.index(worker)]


def test_every_mode_runs_through_a_backend_written_from_the_contract() -> None:
    wg = ListBackend(2)
    assert wg.one_to_all(1) == [(0, 1, None), (1, 1, None)]
    assert wg.rank_zero("z") == (0, "z")
    assert wg.shard_rows(Batch(range(3))) == Batch([(0, 0), (0, 1), (1, 2)])
    assert [m["rank"] for m in wg.metric(Batch(range(3)))] == [0, 1]


def test_default_pending_outputs_wrap_finished_values_in_lazy_futures() -> None:
    wg = ListBackend(2)
    fut = wg.shard_rows.options(blocking=False)(Batch(range(3)))
    assert isinstance(fut, LazyFuture)
    assert fut.get() == Batch([(0, 0), (0, 1), (1, 2)])
    futs = wg.later(1)
    assert [f.get() for f in futs] == [1, 2]


def test_bytes_reported_by_the_backend_land_in_the_span() -> None:
    wg = ListBackend(2)
    with SpanRecorder() as rec:
        wg.one_to_all(0)
    (span,) = rec.spans
    assert (span.bytes_put, span.bytes_fetched) == (20, 10)


def test_a_dead_worker_makes_the_call_and_the_next_calls_raise() -> None:
    wg = ListBackend(3)
    wg.alive[2] = False
    with pytest.raises(WorkerDiedError) as info:
        wg.one_to_all(0)
    assert info.value.ranks == (2,)
    assert info.value.method == "one_to_all"
    assert "actor died" in str(info.value)
    assert wg.dead_ranks == [2]
    with pytest.raises(WorkerDiedError, match=r"one_to_all: worker rank 2 died"):
        wg.one_to_all(0)
    # A rank-zero call does not touch rank 2 and still works.
    assert wg.rank_zero("z") == (0, "z")


def test_the_aliveness_check_records_dead_workers_for_the_next_call() -> None:
    wg = ListBackend(3)
    assert wg.check_worker_aliveness() == []
    wg.alive[1] = False
    assert wg.check_worker_aliveness() == [1]
    assert wg.check_worker_aliveness() == []  # reported once
    with pytest.raises(WorkerDiedError, match=r"rank 1 died.*aliveness check"):
        wg.one_to_all(0)


def test_the_aliveness_thread_finds_a_death(monkeypatch: pytest.MonkeyPatch) -> None:
    wg = ListBackend(2)
    wg.start_worker_aliveness_check(0.01, abort_on_death=False)
    wg.start_worker_aliveness_check(0.01)  # already running: no second thread
    found = threading.Event()
    original = wg.check_worker_aliveness

    def spy() -> list[int]:
        newly = original()
        if newly:
            found.set()
        return newly

    monkeypatch.setattr(wg, "check_worker_aliveness", spy)
    wg.alive[0] = False
    assert found.wait(30)
    wg.stop_worker_aliveness_check()
    with pytest.raises(WorkerDiedError, match="rank 0"):
        wg.one_to_all(0)


def test_abort_on_worker_death_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    raised: list[int] = []
    done = threading.Event()

    def fake_raise_signal(sig: int) -> None:
        raised.append(sig)
        done.set()

    monkeypatch.setattr(signal, "raise_signal", fake_raise_signal)
    monkeypatch.setenv("SC_ABORT_ON_WORKER_DEATH", "1")
    wg = ListBackend(2)
    wg.start_worker_aliveness_check(0.01)
    wg.alive[1] = False
    assert done.wait(30)
    wg.stop_worker_aliveness_check()
    assert raised[0] == signal.SIGABRT


def test_aliveness_interval_is_checked() -> None:
    with pytest.raises(InvalidCallOptionsError, match="every_n_seconds"):
        ListBackend(1).start_worker_aliveness_check(0)


def test_waiting_for_workers_to_come_alive_times_out() -> None:
    wg = ListBackend(2)
    wg.alive[1] = False
    with pytest.raises(
        WorkerDiedError, match=r"worker rank 1 died \(not alive 0.01s after start\)"
    ):
        wg._block_until_all_workers_alive(timeout=0.01)


def test_backend_timeout_is_reported() -> None:
    wg = ListBackend(2)
    wg.pending_ranks = {1}
    with pytest.raises(CallTimeoutError, match="rank 1"):
        wg.one_to_all.options(timeout=1)(0)


def test_a_backend_returning_too_few_outputs_is_caught() -> None:
    class Short(ListBackend):
        def _wait(self, handles: Sequence[Any], call: Call) -> list[Any]:
            return super()._wait(handles, call)[:-1]

    with pytest.raises(WorkerGroupError, match="returned 1 outputs for 2 handles"):
        Short(2).one_to_all(0)


def test_a_group_without_workers_refuses_calls() -> None:
    class Empty(ListBackend):
        def __init__(self) -> None:
            super().__init__(1)
            self._workers = []

    wg = Empty()
    with pytest.raises(WorkerGroupError, match="no workers"):
        wg.one_to_all(0)
    with pytest.raises(WorkerGroupError, match="no workers"):
        wg.execute_rank_zero("one_to_all", 0)


def test_local_kill_worker_simulates_a_death() -> None:
    wg = LocalWorkerGroup(ResourcePool([3]), ClassWithInitArgs(EchoWorker))
    try:
        wg.kill_worker(1)
        assert wg.check_worker_aliveness() == [1]
        with pytest.raises(WorkerDiedError, match="one_to_all: worker rank 1 died"):
            wg.one_to_all(0)
        assert wg.rank_zero("z") == (0, "z")
        with pytest.raises(ValueError, match="kill_worker: rank must be an int"):
            wg.kill_worker(3)
    finally:
        wg.close()


def test_local_kill_worker_is_found_by_the_next_call() -> None:
    wg = LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(EchoWorker))
    try:
        wg.kill_worker(0)
        with pytest.raises(WorkerDiedError, match="rank 0 died"):
            wg.one_to_all(0)
        assert wg.dead_ranks == [0]
        handle = wg.execute_rank_zero_async("one_to_all", 0)
        with pytest.raises(WorkerDiedError):
            handle.result()
    finally:
        wg.close()
