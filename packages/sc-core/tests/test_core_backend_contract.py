"""Minimal backends written from the contract alone, and dead-worker reporting through them.

The tests that take ``make`` run on a group holding a :class:`sc_core.backend.Backend` (the
contract); a group written against sc-core 0.1's hook methods, which sc no longer adapts, is
refused with ``BackendNotImplementedError``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from _core_fakes import Batch, EchoWorker
from sc_core import (
    CallTimeoutError,
    ClassWithInitArgs,
    InvalidCallOptionsError,
    InvalidConfigError,
    LazyFuture,
    LocalWorkerGroup,
    MethodCollisionError,
    ResourcePool,
    SpanRecorder,
    Worker,
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
    WorkerGroupClosedError,
    WorkerGroupError,
)
from sc_core.backend import Backend, BackendNotImplementedError, Call, CallHandle, worker_context
from sc_dispatch import Dispatch, register


def _run_rank(
    state: Any, rank: int, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str, int, Any]:
    """Run one rank's call at once: ("ok", rank, value) / ("error", rank, exc) /
    ("dead", rank, None) / ("pending", rank, None), from ``state.alive`` and
    ``state.pending_ranks``."""
    if not state.alive[rank]:
        return ("dead", rank, None)
    if rank in state.pending_ranks:
        return ("pending", rank, None)
    try:
        return ("ok", rank, getattr(state.workers[rank], method_name)(*args, **kwargs))
    except Exception as exc:
        return ("error", rank, exc)


def _values(handles: Sequence[Any], call: Call) -> list[Any]:
    """The values of the handles of ``_run_rank``, or the contract's error for them."""
    pending = [r for kind, r, _ in handles if kind == "pending"]
    if pending:
        raise CallTimeoutError(call.method_name, pending, call.timeout)
    dead = [r for kind, r, _ in handles if kind == "dead"]
    if dead:
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


class HooksOnly(WorkerGroup):
    """A group written against sc-core 0.1's hook methods, attaching no backend."""

    def __init__(self, n: int) -> None:
        super().__init__(ResourcePool([n]), name_prefix="hooksonly")
        for rank in range(n):
            with worker_context({"WORLD_SIZE": str(n), "RANK": str(rank)}):
                self._workers.append(EchoWorker())
        self._bind_worker_method(EchoWorker)

    def _execute_rank_async(
        self, rank: int, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:  # pragma: no cover - never called: sc no longer adapts the 0.1 hooks
        return _run_rank(self, rank, method_name, args, kwargs)


class ListProtocolBackend:
    """Runs each call at once, storing ("ok", value) / ("error", exc) / ("dead", None) /
    ("pending", None)."""

    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers
        self.alive = [True] * len(workers)
        self.pending_ranks: set[int] = set()
        self.closed = 0

    def start(self, call: Call, method_name: str, rank_args: Sequence[Any]) -> CallHandle:
        call.span.add_bytes(put=10 * len(call.ranks))
        handles: list[Any] = []
        for rank, (args, kwargs) in zip(call.ranks, rank_args, strict=True):
            handles.append(_run_rank(self, rank, method_name, args, kwargs))
        return CallHandle(call, handles)

    def wait(self, handle: CallHandle) -> list[Any]:
        return _values(handle.rank_handles, handle.call)

    def pending(self, handle: CallHandle) -> list[Any]:
        return [LazyFuture.completed(v, "list") for v in self.wait(handle)]

    def is_done(self, rank_handle: Any) -> bool:
        return bool(rank_handle[0] != "pending")

    def cancel(self, rank_handle: Any) -> bool:
        return False

    def is_alive(self, rank: int) -> bool:
        return self.alive[rank]

    def close(self) -> None:
        self.closed += 1


class ProtocolGroup(WorkerGroup):
    """A group holding a ListProtocolBackend."""

    def __init__(self, n: int) -> None:
        super().__init__(ResourcePool([n]), name_prefix="protocolbackend")
        for rank in range(n):
            with worker_context({"WORLD_SIZE": str(n), "RANK": str(rank)}):
                self._workers.append(EchoWorker())
        self.backend = ListProtocolBackend(self._workers)
        self._attach_backend(self.backend)
        self._bind_worker_method(EchoWorker)

    @property
    def alive(self) -> list[bool]:
        return self.backend.alive

    @property
    def pending_ranks(self) -> set[int]:
        return self.backend.pending_ranks

    @pending_ranks.setter
    def pending_ranks(self, ranks: set[int]) -> None:
        self.backend.pending_ranks = ranks


@pytest.fixture
def make() -> Any:
    return ProtocolGroup


def test_a_group_with_0_1_hook_methods_and_no_backend_is_refused() -> None:
    wg = HooksOnly(2)
    with pytest.raises(
        BackendNotImplementedError, match=r"HooksOnly.one_to_all: the group has no backend"
    ):
        wg.one_to_all(0)


def test_the_protocol_backend_meets_the_contract() -> None:
    assert isinstance(ListProtocolBackend([]), Backend)
    with pytest.raises(TypeError, match=r"does not implement sc_core\.Backend"):
        ProtocolGroup(1)._attach_backend(object())  # type: ignore[arg-type]


def test_close_reaches_the_backend_once_and_refuses_later_calls() -> None:
    with ProtocolGroup(2) as wg:
        role = wg._shallow_copy()
        assert wg.one_to_all(1) == [(0, 1, None), (1, 1, None)]
    assert wg.closed
    assert role.closed
    wg.close()
    role.close()
    assert wg.backend.closed == 1
    for group in (wg, role):
        with pytest.raises(WorkerGroupClosedError, match=r"one_to_all: the worker group was"):
            group.one_to_all(0)
        with pytest.raises(WorkerGroupClosedError):
            group.execute_all_sync("one_to_all", 0)


def test_every_mode_runs_through_a_backend_written_from_the_contract(make: Any) -> None:
    wg = make(2)
    assert wg.one_to_all(1) == [(0, 1, None), (1, 1, None)]
    assert wg.rank_zero("z") == (0, "z")
    assert wg.shard_rows(Batch(range(3))) == Batch([(0, 0), (0, 1), (1, 2)])
    assert [m["rank"] for m in wg.metric(Batch(range(3)))] == [0, 1]


def test_default_pending_outputs_wrap_finished_values_in_lazy_futures(make: Any) -> None:
    wg = make(2)
    fut = wg.shard_rows.options(blocking=False)(Batch(range(3)))
    assert isinstance(fut, LazyFuture)
    assert fut.get() == Batch([(0, 0), (0, 1), (1, 2)])
    futs = wg.later(1)
    assert [f.get() for f in futs] == [1, 2]


def test_bytes_reported_by_the_backend_land_in_the_span(make: Any) -> None:
    wg = make(2)
    with SpanRecorder() as rec:
        wg.one_to_all(0)
    (span,) = rec.spans
    assert (span.bytes_put, span.bytes_fetched) == (20, 10)


def test_a_dead_worker_makes_the_call_and_the_next_calls_raise(make: Any) -> None:
    wg = make(3)
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


def test_the_aliveness_check_records_dead_workers_for_the_next_call(make: Any) -> None:
    wg = make(3)
    assert wg.check_worker_aliveness() == []
    wg.alive[1] = False
    assert wg.check_worker_aliveness() == [1]
    assert wg.check_worker_aliveness() == []  # reported once
    with pytest.raises(WorkerDiedError, match=r"rank 1 died.*aliveness check"):
        wg.one_to_all(0)


def test_the_aliveness_thread_finds_a_death(monkeypatch: pytest.MonkeyPatch, make: Any) -> None:
    wg = make(2)
    wg.start_worker_aliveness_check(0.01, abort_on_death=False)
    wg.start_worker_aliveness_check(0.01)  # already running: no second thread
    found = threading.Event()
    original = wg.check_worker_aliveness

    def spy() -> list[int]:
        newly: list[int] = original()
        if newly:
            found.set()
        return newly

    monkeypatch.setattr(wg, "check_worker_aliveness", spy)
    wg.alive[0] = False
    assert found.wait(30)
    wg.stop_worker_aliveness_check()
    with pytest.raises(WorkerDiedError, match="rank 0"):
        wg.one_to_all(0)


def test_abort_on_worker_death_is_opt_in(monkeypatch: pytest.MonkeyPatch, make: Any) -> None:
    raised: list[int] = []
    done = threading.Event()

    def fake_raise_signal(sig: int) -> None:
        raised.append(sig)
        done.set()

    monkeypatch.setattr(signal, "raise_signal", fake_raise_signal)
    monkeypatch.setenv("SC_CORE_ABORT_ON_WORKER_DEATH", "1")
    wg = make(2)
    wg.start_worker_aliveness_check(0.01)
    wg.alive[1] = False
    assert done.wait(30)
    wg.stop_worker_aliveness_check()
    assert raised[0] == signal.SIGABRT


def test_aliveness_interval_is_checked(make: Any) -> None:
    with pytest.raises(InvalidCallOptionsError, match="every_n_seconds"):
        make(1).start_worker_aliveness_check(0)


def test_waiting_for_workers_to_come_alive_times_out(make: Any) -> None:
    wg = make(2)
    wg.alive[1] = False
    with pytest.raises(
        WorkerDiedError, match=r"worker rank 1 died \(not alive 0.01s after start\)"
    ):
        wg._block_until_all_workers_alive(timeout=0.01)


def test_backend_timeout_is_reported(make: Any) -> None:
    wg = make(2)
    wg.pending_ranks = {1}
    with pytest.raises(CallTimeoutError, match="rank 1"):
        wg.one_to_all.options(timeout=1)(0)


def test_a_backend_returning_too_few_outputs_is_caught() -> None:
    class Short(ListProtocolBackend):
        def wait(self, handle: CallHandle) -> list[Any]:
            return super().wait(handle)[:-1]

    wg = ProtocolGroup(2)
    wg._attach_backend(Short(wg._workers))
    with pytest.raises(WorkerGroupError, match=r"backend returned 1 values for ranks \[0, 1\]"):
        wg.one_to_all(0)


def test_a_group_without_workers_refuses_calls() -> None:
    class Empty(ProtocolGroup):
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


def test_kill_worker_of_a_backend_that_cannot_kill_is_not_implemented() -> None:
    wg = ProtocolGroup(2)
    with pytest.raises(
        BackendNotImplementedError, match=r"ProtocolGroup 'protocolbackend'.kill_worker"
    ):
        wg.kill_worker(1)
    with pytest.raises(InvalidConfigError, match=r"kill_worker: rank must be an int in \[0, 2\)"):
        wg.kill_worker(2)
    with pytest.raises(InvalidConfigError, match="got True"):
        wg.kill_worker(True)
    assert wg.one_to_all(0) == [(0, 0, None), (1, 0, None)]  # nobody was killed


class NamesAMethodKillWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def kill_worker(self, rank: int) -> int:
        return rank


def test_kill_worker_is_a_reserved_group_name() -> None:
    wg: WorkerGroup = WorkerGroup(ResourcePool([1]))
    with pytest.raises(MethodCollisionError, match=r"'kill_worker'.*already an attribute"):
        wg._bind_worker_method(NamesAMethodKillWorker)


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
