"""Call ids and the workers' journal on the in-process backend: a call with an id runs once,
a re-attached driver (a higher epoch) replaying the same calls gets the stored outcomes, an
older driver is fenced off, old steps are forgotten, and every bad argument is refused."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _core_fakes import PROPERTY, Batch, CountingWorker, Plain
from hypothesis import given
from hypothesis import strategies as st
from sc_core import (
    CallId,
    CallIds,
    CallRecord,
    ClassWithInitArgs,
    ConfigTypeError,
    InvalidConfigError,
    LocalWorkerGroup,
    ResourcePool,
    StaleDriverError,
    WorkerError,
    create_colocated_worker_cls,
)
from sc_core._journal import journal_of
from sc_core.backend import CALL_ID_KWARG, KEEP_SCOPES, run_journaled, run_journaled_async
from sc_dispatch import Dispatch, register


class Counting(CountingWorker):
    """Counts how often each method ran."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def step(self, x: int) -> tuple[int, int, int]:
        return self.rank, x, self._count("step")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail(self, message: str) -> None:
        self._count("fail")
        raise ValueError(f"rank {self.rank}: {message}")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[arg-type]
    def keywords(self, **kwargs: Any) -> list[str]:
        return sorted(kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def later(self, x: int) -> int:
        return x * 10 + self._count("later")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def square(self, batch: Batch) -> Batch:
        self._count("square")
        return Batch([r * r for r in batch.rows])

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_BALANCED)
    def balanced(self, batch: Batch) -> Batch:
        self._count("balanced")
        return Batch([r + 1 for r in batch.rows])


@pytest.fixture
def wg() -> Iterator[LocalWorkerGroup[Any]]:
    with LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(Counting)) as group:
        yield group


def _ran(wg: LocalWorkerGroup[Any], name: str) -> list[int]:
    counts: list[dict[str, int]] = wg.execute_all_sync("counts")  # a raw call: no id
    return [c.get(name, 0) for c in counts]


def _driver(wg: LocalWorkerGroup[Any], epoch: int, step: int) -> CallIds:
    ids = CallIds(epoch=epoch)
    ids.begin(step)
    wg.use_call_ids(ids)
    return ids


# --------------------------------------------------------------------------- replay


def test_calls_run_once_and_a_new_driver_gets_the_stored_results(
    wg: LocalWorkerGroup[Any],
) -> None:
    _driver(wg, 0, 1)
    first = [wg.step(1), wg.step(2), wg.square(Batch(range(4)))]
    assert first[0] == [(0, 1, 1), (1, 1, 1)]
    assert first[1] == [(0, 2, 2), (1, 2, 2)]
    _driver(wg, 1, 1)  # the driver died; a new one replays step 1 in the same order
    assert [wg.step(1), wg.step(2), wg.square(Batch(range(4)))] == first
    assert _ran(wg, "step") == [2, 2]
    assert _ran(wg, "square") == [1, 1]
    assert wg.step(3) == [(0, 3, 3), (1, 3, 3)]  # past the replayed calls: runs


def test_a_stored_exception_is_raised_again_on_replay(wg: LocalWorkerGroup[Any]) -> None:
    _driver(wg, 0, 5)
    with pytest.raises(WorkerError, match="rank 0: boom") as first:
        wg.fail("boom")
    _driver(wg, 1, 5)
    with pytest.raises(WorkerError, match="rank 0: boom") as again:
        wg.fail("boom")
    assert isinstance(first.value, ValueError)
    assert isinstance(again.value, ValueError)
    assert again.value.error_type == first.value.error_type
    assert _ran(wg, "fail") == [1, 1]
    assert wg.last_calls()[1]["fail"] == CallRecord(0, 5, "fail#0", False)


def test_a_non_blocking_call_and_a_stream_are_replayed(wg: LocalWorkerGroup[Any]) -> None:
    _driver(wg, 0, 2)
    futures = wg.later(4)
    values = [f.get() if hasattr(f, "get") else f for f in futures]
    streamed = wg.square.stream(Batch(range(4))).result()
    _driver(wg, 1, 2)
    assert [f.get() if hasattr(f, "get") else f for f in wg.later(4)] == values
    assert wg.square.stream(Batch(range(4))).result() == streamed
    assert _ran(wg, "later") == [1, 1]
    assert _ran(wg, "square") == [1, 1]


def test_free_units_have_ids_of_their_own(wg: LocalWorkerGroup[Any]) -> None:
    _driver(wg, 0, 1)
    assert wg.balanced(Batch(range(6))) == Batch([r + 1 for r in range(6)])
    keys = sorted(r["balanced"].key for r in wg.last_calls() if "balanced" in r)
    assert keys
    assert all(k.startswith("balanced#0/u") for k in keys)
    _driver(wg, 1, 1)
    assert wg.balanced(Batch(range(6))) == Batch([r + 1 for r in range(6)])


def test_an_older_driver_is_fenced_off(wg: LocalWorkerGroup[Any]) -> None:
    old = _driver(wg, 0, 1)
    wg.step(1)
    _driver(wg, 1, 1)
    wg.step(1)
    wg.use_call_ids(old)  # the old driver comes back
    with pytest.raises(WorkerError, match="newer driver") as info:
        wg.step(2)
    err = info.value
    assert isinstance(err, StaleDriverError)
    assert isinstance(err, RuntimeError)
    message = str(err)
    assert "step" in message
    assert "rank 0" in message
    assert "epoch 0" in message
    assert "epoch 1" in message
    assert list(err.other_failed_ranks) == [1]


def test_outcomes_older_than_the_previous_step_are_dropped(wg: LocalWorkerGroup[Any]) -> None:
    assert KEEP_SCOPES == 2
    ids = _driver(wg, 0, 1)
    wg.step(1)
    ids.begin(2)
    wg.step(1)
    _driver(wg, 1, 1)
    wg.step(1)  # step 1 is the previous of step 2: still kept
    assert _ran(wg, "step") == [2, 2]
    ids = _driver(wg, 1, 3)
    wg.step(1)  # step 3 seen: step 1 is dropped
    _driver(wg, 2, 1)
    wg.step(1)  # a replay of step 1 now runs again
    assert _ran(wg, "step") == [4, 4]


def test_a_driver_that_retains_an_older_scope_gets_it_replayed(
    wg: LocalWorkerGroup[Any],
) -> None:
    """A call launched in scope 1 and taken in scope 4 (a prefetched generation): with
    ``retain_from(1)`` the workers keep it, and a new driver replaying it gets the stored
    outcome; once the driver moves ``retain_from`` past it, it is dropped."""
    ids = _driver(wg, 0, 1)
    ids.retain_from(1)
    launched = wg.step(7)
    for scope in (2, 3, 4):
        ids.begin(scope)
        wg.step(scope)
    assert wg.step(1)
    assert ids.keep_from == 1
    replay = _driver(wg, 1, 4)
    replay.retain_from(1)
    with replay.scope(1):
        assert wg.step(7) == launched  # answered from the journal, three scopes later
    assert _ran(wg, "step") == [5, 5]
    replay.retain_from(4)
    wg.step(4)  # keep_from 4 reaches the workers: scopes 1 to 3 are dropped
    with replay.scope(1):
        wg.step(7)  # a replay of scope 1 now runs again
    assert _ran(wg, "step") == [6, 6]
    replay.retain_from(None)
    assert replay.keep_from is None
    assert CallId(0, 3, "m#0", keep_from=1).unit(2) == CallId(0, 3, "m#0/u2", keep_from=1)


def test_last_calls_per_rank(wg: LocalWorkerGroup[Any]) -> None:
    assert wg.last_calls() == [{}, {}]  # no call with an id yet
    _driver(wg, 3, 7)
    wg.step(1)
    wg.step(2)
    calls = wg.last_calls()
    assert len(calls) == 2
    for per_rank in calls:
        assert per_rank["step"] == CallRecord(3, 7, "step#1", True)
        assert "_sc_last_calls" not in per_rank


def test_a_worker_class_that_is_not_a_worker_has_no_records() -> None:
    with LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(Plain)) as group:
        group.use_call_ids(CallIds())
        assert group.hello() == ["hi", "hi"]
        assert group.last_calls() == [{}, {}]


def _ids(wg: LocalWorkerGroup[Any]) -> CallIds | None:
    return wg.call_ids


def test_ids_are_off_by_default_and_never_reach_the_method(wg: LocalWorkerGroup[Any]) -> None:
    assert _ids(wg) is None
    assert wg.keywords(a=1) == [["a"], ["a"]]
    wg.step(1)
    wg.step(1)
    assert _ran(wg, "step") == [2, 2]
    assert wg.last_calls() == [{}, {}]
    ids = _driver(wg, 0, 1)
    assert _ids(wg) is ids
    assert wg.keywords(a=1) == [["a"], ["a"]]  # the id is taken out before the method
    wg.use_call_ids(None)
    assert wg.call_ids is None
    wg.step(1)
    wg.step(1)
    assert _ran(wg, "step") == [4, 4]


def test_framework_calls_carry_no_id(wg: LocalWorkerGroup[Any]) -> None:
    ids = _driver(wg, 0, 1)
    assert wg.execute_all_sync("step", 1) == [(0, 1, 1), (1, 1, 1)]
    assert wg.execute_all_sync("step", 1) == [(0, 1, 2), (1, 1, 2)]
    wg.last_calls()
    assert ids.next(wg.name_prefix, "step") == CallId(0, 1, "step#0")


class Actor(Counting):
    pass


def test_spawned_groups_take_the_allocator_at_spawn_time() -> None:
    cls = create_colocated_worker_cls({"actor": ClassWithInitArgs(Actor)})
    with LocalWorkerGroup(ResourcePool([2]), cls) as group:
        before = group.spawn(["actor"])["actor"]
        ids = _driver(group, 0, 1)
        after = group.spawn(["actor"])["actor"]
        assert before.call_ids is None
        assert after.call_ids is ids
        first = after.step(1)
        _driver(after, 1, 1)
        assert after.step(1) == first
        assert group.last_calls()[0]["actor_step"] == CallRecord(0, 1, "actor_step#0", True)
        assert after.last_calls() == group.last_calls()


# --------------------------------------------------------------------------- the allocator


def test_counters_run_per_scope_group_and_method() -> None:
    ids = CallIds(epoch=2)
    assert (ids.epoch, ids.current_scope) == (2, 0)
    ids.begin(4)
    assert ids.next("g", "m") == CallId(2, 4, "m#0")
    assert ids.next("g", "m") == CallId(2, 4, "m#1")
    assert ids.next("g", "n") == CallId(2, 4, "n#0")
    assert ids.next("h", "m") == CallId(2, 4, "m#0")
    ids.begin(5)
    assert ids.next("g", "m") == CallId(2, 5, "m#0")
    with ids.scope(4):
        assert ids.current_scope == 4
        assert ids.next("g", "m") == CallId(2, 4, "m#2")  # re-issued in step 4
    assert ids.current_scope == 5
    assert ids.next("g", "m") == CallId(2, 5, "m#1")
    assert "epoch=2" in repr(ids)


def test_scope_reissues_an_earlier_steps_call(wg: LocalWorkerGroup[Any]) -> None:
    ids = _driver(wg, 0, 1)
    first = wg.step(1)
    ids.begin(2)
    new = _driver(wg, 1, 2)
    with new.scope(1):
        assert wg.step(1) == first  # the call of step 1, re-issued: not run again
    assert _ran(wg, "step") == [1, 1]


def test_a_unit_id_names_its_unit() -> None:
    assert CallId(1, 2, "m#0").unit(3) == CallId(1, 2, "m#0/u3")


@PROPERTY
@given(
    st.lists(st.tuples(st.sampled_from(["g", "h"]), st.sampled_from(["m", "n", "o"])), max_size=30),
    st.integers(0, 3),
)
def test_ids_are_unique_within_a_scope(calls: list[tuple[str, str]], scope: int) -> None:
    ids = CallIds()
    ids.begin(scope)
    issued = [(group, ids.next(group, method)) for group, method in calls]
    assert len(set(issued)) == len(issued)
    assert all(i.scope == scope for _, i in issued)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: CallId(-1, 0, "k"), InvalidConfigError, "epoch must be an int >= 0"),
        (lambda: CallId(True, 0, "k"), ConfigTypeError, "epoch"),
        (lambda: CallId(0, 1.5, "k"), ConfigTypeError, "scope"),  # type: ignore[arg-type]
        (lambda: CallId(0, -2, "k"), InvalidConfigError, "scope"),
        (lambda: CallId(0, 0, ""), InvalidConfigError, "key must be a non-empty str"),
        (lambda: CallId(0, 0, 3), ConfigTypeError, "key"),  # type: ignore[arg-type]
        (lambda: CallId(0, 0, "k", keep_from=-1), InvalidConfigError, "keep_from"),
        (lambda: CallIds().retain_from(-3), InvalidConfigError, "CallIds.retain_from"),
        (lambda: CallIds(epoch=-1), InvalidConfigError, "CallIds: epoch"),
        (lambda: CallIds(epoch="1"), ConfigTypeError, "CallIds: epoch"),  # type: ignore[arg-type]
        (lambda: CallIds().begin(-1), InvalidConfigError, "CallIds.begin: scope"),
        (lambda: CallIds().begin(False), ConfigTypeError, "CallIds.begin: scope"),
        (lambda: CallIds().scope(-1).__enter__(), InvalidConfigError, "CallIds.scope"),
        (lambda: CallIds().next("", "m"), InvalidConfigError, "group"),
        (lambda: CallIds().next("g", None), ConfigTypeError, "method"),  # type: ignore[arg-type]
    ],
)
def test_bad_ids_are_refused(make: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_use_call_ids_refuses_a_wrong_type(wg: LocalWorkerGroup[Any]) -> None:
    with pytest.raises(ConfigTypeError, match=r"use_call_ids: expected a sc_core\.CallIds"):
        wg.use_call_ids(CallId(0, 0, "k"))  # type: ignore[arg-type]
    assert wg.call_ids is None


# --------------------------------------------------------------------------- the journal


class _Bare:
    _rank = 3


def _id(epoch: int = 0, scope: int = 0, key: str = "m#0") -> dict[str, Any]:
    return {CALL_ID_KWARG: CallId(epoch, scope, key)}


def test_a_duplicate_waits_for_the_running_original() -> None:
    worker = _Bare()
    started, release = threading.Event(), threading.Event()
    runs: list[dict[str, Any]] = []

    def run(kwargs: dict[str, Any]) -> str:
        runs.append(kwargs)
        started.set()
        release.wait(10)
        return "done"

    results: list[str] = []
    kwargs = {**_id(), "x": 1}
    original = threading.Thread(
        target=lambda: results.append(run_journaled(worker, "m", kwargs, run))
    )
    original.start()
    started.wait(10)
    duplicate = threading.Thread(
        target=lambda: results.append(run_journaled(worker, "m", _id(epoch=1), run))
    )
    # the duplicate reaches the journal's wait for the running original, and stays there
    waiting = threading.Event()
    journal = journal_of(worker)
    wait = journal.wait

    def noted_wait(entry: Any) -> None:
        waiting.set()
        wait(entry)

    journal.wait = noted_wait  # type: ignore[method-assign]
    duplicate.start()
    assert waiting.wait(10)
    assert results == []  # the original is held, so nothing has returned
    assert runs == [{"x": 1}]
    release.set()
    original.join(10)
    duplicate.join(10)
    assert results == ["done", "done"]
    assert runs == [{"x": 1}]  # ran once, without the id
    assert CALL_ID_KWARG in kwargs  # the caller's dict is left alone


def test_an_interrupted_call_is_not_stored() -> None:
    worker = _Bare()
    calls = []

    def interrupted(kwargs: dict[str, Any]) -> str:
        calls.append(1)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_journaled(worker, "m", _id(), interrupted)
    assert run_journaled(worker, "m", _id(), lambda kw: "ran") == "ran"
    assert calls == [1]


def test_a_reserved_keyword_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ConfigTypeError, match=r"_Bare.m \(rank 3\): keyword '_sc_call_id'"):
        run_journaled(_Bare(), "m", {CALL_ID_KWARG: "m#0"}, lambda kw: None)


def test_a_fused_workers_method_is_named_by_its_first_argument() -> None:
    worker = _Bare()
    run_journaled(worker, "_fuw_execute", _id(epoch=1), lambda kw: 1, ("actor_fwmn_step",))
    with pytest.raises(StaleDriverError, match=r"_Bare.actor_fwmn_step \(rank 3\)"):
        run_journaled(worker, "_fuw_execute", _id(), lambda kw: 1, ("actor_fwmn_step",))


def test_the_async_journal_runs_once_for_concurrent_duplicates() -> None:
    worker = _Bare()
    runs = []

    async def run(kwargs: dict[str, Any]) -> int:
        runs.append(1)
        await asyncio.sleep(0.05)
        if kwargs.get("fail"):
            raise ValueError("async boom")
        return 7

    async def main() -> list[Any]:
        first = await asyncio.gather(
            run_journaled_async(worker, "m", _id(), run),
            run_journaled_async(worker, "m", _id(epoch=1), run),
        )
        kwargs = {**_id(epoch=1, key="f#0"), "fail": True}
        errors = await asyncio.gather(
            run_journaled_async(worker, "f", kwargs, run),
            run_journaled_async(worker, "f", kwargs, run),
            return_exceptions=True,
        )
        plain = await run_journaled_async(worker, "m", {}, run)
        return [*first, *[str(e) for e in errors], plain]

    assert asyncio.run(main()) == [7, 7, "async boom", "async boom", 7]
    assert len(runs) == 3


def test_the_async_journal_fences_and_forgets_interrupted_calls() -> None:
    worker = _Bare()

    async def cancelled(kwargs: dict[str, Any]) -> int:
        raise asyncio.CancelledError

    async def main() -> int:
        with pytest.raises(asyncio.CancelledError):
            await run_journaled_async(worker, "m", _id(epoch=2), cancelled)

        async def ok(kwargs: dict[str, Any]) -> int:
            return 1

        with pytest.raises(StaleDriverError, match=r"epoch 1.*epoch 2"):
            await run_journaled_async(worker, "m", _id(epoch=1), ok)
        return await run_journaled_async(worker, "m", _id(epoch=2), ok)

    assert asyncio.run(main()) == 1
