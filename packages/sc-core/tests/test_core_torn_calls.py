"""Torn calls on the in-process backend: a driver that stopped while it handed a call out
(``arm_torn_dispatch``: the call reached rank 0 only, which now waits inside a "collective"
for rank 1), and a new driver (a higher epoch) that asks the journals first
(``adopt_journals``), gets the earlier calls of the step answered while rank 0 is still busy,
and completes the torn call by calling it again: rank 1 runs it, rank 0 joins its running
original; every method runs once per rank. Also the journal's report of running calls, the
control lane, and every bad argument."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _core_fakes import Batch, CountingWorker, Plain
from sc_core import (
    CallId,
    CallIds,
    ClassWithInitArgs,
    ConfigTypeError,
    InjectedFaultError,
    InvalidConfigError,
    JournaledCall,
    LocalWorkerGroup,
    ResourcePool,
    TornCall,
    WorkerError,
    WorkerGroupError,
    create_colocated_worker_cls,
)
from sc_core._journal import await_journaled, journaled_calls
from sc_core.backend import (
    CALL_ID_KWARG,
    CONTROL_METHODS,
    JOURNAL_LANE_KWARG,
    on_control_lane,
    run_journaled,
    run_journaled_async,
)
from sc_core.ext import arm_torn_dispatch, disarm_torn_dispatch
from sc_dispatch import Dispatch, Execute, register

#: one barrier per group (by tag): the in-process stand-in for a collective
_BARRIERS: dict[str, threading.Barrier] = {}
_tags = itertools.count()


class Pair(CountingWorker):
    """Counts its runs; ``allreduce`` waits for every rank, as a collective does."""

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag
        self.entered = threading.Event()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def step(self, x: int) -> tuple[int, int]:
        self._count("step")
        return self.rank, x

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def square(self, batch: Batch) -> Batch:
        self._count("square")
        return Batch([r * r for r in batch.rows])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def allreduce(self, x: int) -> tuple[int, int]:
        self._count("allreduce")
        self.entered.set()
        _BARRIERS[self.tag].wait(timeout=30)  # every rank must enter
        return self.rank, x + 1

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on_zero(self, x: int) -> int:
        self._count("fail_on_zero")
        if self.rank == 0:
            raise ValueError(f"rank 0 refuses {x}")
        return x

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def lead(self) -> int:
        self._count("lead")
        return self.rank


@pytest.fixture
def wg() -> Iterator[LocalWorkerGroup[Any]]:
    tag = f"pair-{next(_tags)}"
    _BARRIERS[tag] = threading.Barrier(2)
    cia = ClassWithInitArgs(Pair, tag)
    with LocalWorkerGroup(ResourcePool([2]), cia, concurrent=True) as group:
        yield group
    _BARRIERS.pop(tag).abort()  # frees a rank a failed test left waiting
    disarm_torn_dispatch()


def _driver(wg: LocalWorkerGroup[Any], epoch: int, step: int) -> CallIds:
    ids = CallIds(epoch=epoch)
    ids.begin(step)
    wg.use_call_ids(ids)
    return ids


def _ran(wg: LocalWorkerGroup[Any], name: str) -> list[int]:
    counts: list[dict[str, int]] = wg.execute_all_sync("counts")  # no id: the main lane
    return [c.get(name, 0) for c in counts]


def _states(wg: LocalWorkerGroup[Any], scope: int, method: str) -> list[list[str]]:
    return [[c.state for c in rank if c.method == method] for rank in wg.journaled_calls([scope])]


# --------------------------------------------------------------------- a torn collective


def test_a_torn_collective_is_completed_by_the_replay_without_running_twice(
    wg: LocalWorkerGroup[Any],
) -> None:
    _driver(wg, 0, 3)
    first = [wg.step(1), wg.square(Batch(range(4)))]
    reached = threading.Event()
    arm_torn_dispatch(reached.set)
    with pytest.raises(InjectedFaultError, match=r"allreduce#0.*step 3.*ranks \[0\] of \[0, 1\]"):
        wg.allreduce(5)  # the driver "dies" here
    assert reached.is_set()
    assert wg.workers[0].entered.is_set()  # rank 0 waits in the collective for rank 1
    assert not wg.workers[1].entered.is_set()
    assert _states(wg, 3, "allreduce") == [["running"], []]  # asked beside the running call

    _driver(wg, 1, 3)  # a new driver: its first question is the journals of the step
    torn = wg.adopt_journals([3])
    assert torn == [TornCall(wg.name_prefix, 3, "allreduce#0", "allreduce", {0: "running"}, (1,))]
    assert "never received by ranks [1]" in str(torn[0])
    assert "running on ranks [0]" in str(torn[0])
    # the replay: the step's earlier calls are answered from the journals while rank 0 is
    # still inside the torn call, then the torn call itself: rank 1 runs it, rank 0 joins
    assert [wg.step(1), wg.square(Batch(range(4)))] == first
    assert wg.allreduce(5) == [(0, 6), (1, 6)]
    assert _ran(wg, "allreduce") == [1, 1]
    assert _ran(wg, "step") == [1, 1]
    assert _ran(wg, "square") == [1, 1]
    assert wg.busy_ranks == {}
    assert wg.allreduce(7) == [(0, 8), (1, 8)]  # past the replay: the group works as ever
    last = wg.last_calls()
    assert [r["allreduce"].key for r in last] == ["allreduce#1", "allreduce#1"]


def test_a_torn_call_that_finished_where_it_arrived_runs_only_where_it_did_not(
    wg: LocalWorkerGroup[Any],
) -> None:
    _driver(wg, 0, 1)
    arm_torn_dispatch(lambda: None)
    with pytest.raises(InjectedFaultError, match="torn dispatch"):
        wg.step(4)
    # a rank runs its calls in order: this answers once rank 0 has finished ``step``
    assert _ran(wg, "step") == [1, 0]
    _driver(wg, 1, 1)
    (torn,) = wg.adopt_journals([1])
    assert (torn.key, dict(torn.held), torn.missing) == ("step#0", {0: "ok"}, (1,))
    assert wg.step(4) == [(0, 4), (1, 4)]
    assert _ran(wg, "step") == [1, 1]


def test_a_torn_call_that_raised_where_it_arrived_raises_again_and_runs_once_per_rank(
    wg: LocalWorkerGroup[Any],
) -> None:
    _driver(wg, 0, 2)
    arm_torn_dispatch(lambda: None)
    with pytest.raises(InjectedFaultError, match="torn dispatch"):
        wg.fail_on_zero(6)
    assert _ran(wg, "fail_on_zero") == [1, 0]  # answers once rank 0 has finished it
    _driver(wg, 1, 2)
    (torn,) = wg.adopt_journals([2])
    assert (dict(torn.held), torn.missing) == ({0: "error"}, (1,))
    # the replay: rank 0 answers its stored error from the journal, rank 1 runs the call
    with pytest.raises(WorkerError, match="rank 0 refuses 6"):
        wg.fail_on_zero(6)
    assert _ran(wg, "fail_on_zero") == [1, 1]
    assert [[c.state for c in rank] for rank in wg.journaled_calls([2])] == [["error"], ["ok"]]


def test_a_call_every_rank_holds_or_one_rank_alone_was_sent_is_not_torn(
    wg: LocalWorkerGroup[Any],
) -> None:
    _driver(wg, 0, 2)
    wg.step(1)
    assert wg.lead() == 0  # rank zero only: the id says so
    _driver(wg, 1, 2)
    assert wg.adopt_journals([2]) == []
    calls = wg.journaled_calls([2])
    assert [c.key for c in calls[0]] == ["lead#0", "step#0"]
    assert [c.key for c in calls[1]] == ["step#0"]
    lead = calls[0][0]
    assert lead == JournaledCall(0, 2, "lead#0", "lead", "ok", (0,))
    assert lead.done
    assert wg.lead() == 0
    assert _ran(wg, "lead") == [1, 0]


def test_a_rank_zero_call_is_never_torn_on_purpose(wg: LocalWorkerGroup[Any]) -> None:
    _driver(wg, 0, 1)
    arm_torn_dispatch(lambda: None)
    assert wg.lead() == 0  # one rank: nothing to tear
    assert wg.last_calls()  # a framework query neither (no id, the control lane)
    assert disarm_torn_dispatch() is True
    assert disarm_torn_dispatch() is False


def test_adopted_journals_only_route_the_calls_they_held(wg: LocalWorkerGroup[Any]) -> None:
    _driver(wg, 0, 5)
    wg.step(1)
    _driver(wg, 1, 5)
    assert wg.adopt_journals([4, 5]) == []
    assert wg.step(1) == [(0, 1), (1, 1)]  # held: answered
    assert wg.step(2) == [(0, 2), (1, 2)]  # new in the replay: runs
    assert _ran(wg, "step") == [2, 2]


def test_a_replaced_rank_holds_nothing_any_more(wg: LocalWorkerGroup[Any]) -> None:
    _driver(wg, 0, 1)
    wg.step(1)
    _driver(wg, 1, 1)
    wg.adopt_journals([1])
    wg.kill_worker(1)
    assert wg.replace_ranks() == [1]
    assert wg.step(1) == [(0, 1), (1, 1)]  # the new rank 1 runs it: its journal is empty
    assert _ran(wg, "step") == [1, 1]


def test_a_dead_rank_is_not_asked(wg: LocalWorkerGroup[Any]) -> None:
    _driver(wg, 0, 1)
    arm_torn_dispatch(lambda: None)
    with pytest.raises(InjectedFaultError):
        wg.step(1)
    wg.kill_worker(1)
    _driver(wg, 1, 1)
    assert wg.adopt_journals([1]) == []  # rank 1 is dead: recovered, not completed


# --------------------------------------------------------------------- the control lane


def test_framework_queries_answer_while_a_rank_is_busy(wg: LocalWorkerGroup[Any]) -> None:
    _driver(wg, 0, 1)
    arm_torn_dispatch(lambda: None)
    with pytest.raises(InjectedFaultError):
        wg.allreduce(1)
    pids = wg.execute_all_sync("_get_pid")
    assert len(pids) == 2
    assert wg.last_calls() == [{}, {}]  # rank 0's call has not completed
    assert _states(wg, 1, "allreduce") == [["running"], []]
    _BARRIERS[wg.workers[0].tag].abort()  # free rank 0


def test_the_control_lane_is_chosen_by_name_or_by_the_journal_keyword() -> None:
    assert "_sc_journal_calls" in CONTROL_METHODS
    assert on_control_lane("_get_pid", (), {})
    assert on_control_lane("actor__query_dispatch_info", (), {})  # a colocated role's
    assert on_control_lane("_fuw_execute", ("critic__sc_last_calls",), {})  # a fused one's
    assert on_control_lane("update", (), {JOURNAL_LANE_KWARG: True})
    assert not on_control_lane("update", (), {})
    assert not on_control_lane("my_get_pid", (), {})
    assert not on_control_lane("_fuw_execute", (), {})


class Role(Pair):
    pass


def test_a_colocated_group_adopts_its_journals_once_for_every_role() -> None:
    tag = f"pair-{next(_tags)}"
    _BARRIERS[tag] = threading.Barrier(2)
    cls = create_colocated_worker_cls({"actor": ClassWithInitArgs(Role, tag)})
    with LocalWorkerGroup(ResourcePool([2]), cls, concurrent=True) as group:
        actor = group.spawn(["actor"])["actor"]
        _driver(actor, 0, 1)
        arm_torn_dispatch(lambda: None)
        with pytest.raises(InjectedFaultError):
            actor.allreduce(2)
        _driver(actor, 1, 1)
        (torn,) = group.adopt_journals([1])
        assert (torn.method, torn.missing) == ("actor_allreduce", (1,))
        assert actor.allreduce(2) == [(0, 3), (1, 3)]
        assert [r["actor_allreduce"].key for r in actor.last_calls()] == ["actor_allreduce#0"] * 2
    _BARRIERS.pop(tag)


# --------------------------------------------------------------------- the journal


class _Bare:
    _rank = 2


def _id(key: str = "m#0", epoch: int = 0, scope: int = 0) -> CallId:
    return CallId(epoch, scope, key)


def test_a_call_sent_to_the_journal_never_runs() -> None:
    worker = _Bare()
    kwargs = {CALL_ID_KWARG: _id(), JOURNAL_LANE_KWARG: True}
    with pytest.raises(WorkerGroupError, match=r"_Bare.m \(rank 2\): call 'm#0' of step 0"):
        run_journaled(worker, "m", kwargs, lambda kw: "ran")
    assert run_journaled(worker, "m", {CALL_ID_KWARG: _id()}, lambda kw: "ran") == "ran"
    assert run_journaled(worker, "m", kwargs, lambda kw: "again") == "ran"


def test_a_call_sent_to_the_journal_whose_original_was_interrupted_is_an_error() -> None:
    """The original ends without an outcome (a ``BaseException``: nothing stored, it may run
    again); the call waiting for it on the journal lane must not run it: a typed error."""
    worker = _Bare()
    started, release = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    def interrupted(kwargs: dict[str, Any]) -> None:
        started.set()
        release.wait(10)
        raise KeyboardInterrupt

    def original() -> None:
        try:
            run_journaled(worker, "m", {CALL_ID_KWARG: _id()}, interrupted)
        except KeyboardInterrupt as exc:
            outcome.append(exc)

    thread = threading.Thread(target=original)
    thread.start()
    assert started.wait(10)
    timer = threading.Timer(0.05, release.set)
    timer.start()
    kwargs = {CALL_ID_KWARG: _id(epoch=1), JOURNAL_LANE_KWARG: True}
    with pytest.raises(WorkerGroupError, match=r"does not hold it .*was interrupted"):
        run_journaled(worker, "m", kwargs, lambda kw: "ran")
    thread.join(10)
    assert len(outcome) == 1
    assert journaled_calls(worker) == []


def test_an_async_call_sent_to_the_journal_joins_the_running_original() -> None:
    worker = _Bare()
    runs: list[int] = []

    async def run(kwargs: dict[str, Any]) -> int:
        runs.append(1)
        await asyncio.sleep(0.05)
        return 9

    async def main() -> list[int]:
        original = asyncio.ensure_future(
            run_journaled_async(worker, "m", {CALL_ID_KWARG: _id()}, run)
        )
        await asyncio.sleep(0)  # the original claims the id
        kwargs = {CALL_ID_KWARG: _id(epoch=1), JOURNAL_LANE_KWARG: True}
        joined = await run_journaled_async(worker, "m", kwargs, run)
        return [await original, joined]

    assert asyncio.run(main()) == [9, 9]
    assert runs == [1]

    async def missing() -> None:
        kwargs = {CALL_ID_KWARG: _id("n#0", epoch=1), JOURNAL_LANE_KWARG: True}
        await run_journaled_async(worker, "n", kwargs, run)

    with pytest.raises(WorkerGroupError, match="does not hold it"):
        asyncio.run(missing())


def test_the_journal_reports_running_calls_and_waits_for_one_to_arrive() -> None:
    worker = _Bare()
    assert journaled_calls(worker) == []
    release = threading.Event()

    def slow(kwargs: dict[str, Any]) -> str:
        release.wait(10)
        return "slow"

    sent = CallId(3, 7, "m#0").sent_to((0, 2))
    thread = threading.Thread(target=run_journaled, args=(worker, "m", {CALL_ID_KWARG: sent}, slow))
    thread.start()
    assert await_journaled(worker, 7, "m#0", 10) == "running"
    assert journaled_calls(worker, frozenset({7})) == [
        JournaledCall(3, 7, "m#0", "m", "running", (0, 2))
    ]
    release.set()
    thread.join(10)
    assert [c.state for c in journaled_calls(worker)] == ["ok"]
    assert await_journaled(worker, 7, "other#0", 0.01) is None
    assert journaled_calls(worker, frozenset({8})) == []


def test_a_failed_call_is_reported_as_an_error() -> None:
    worker = _Bare()

    def boom(kwargs: dict[str, Any]) -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run_journaled(worker, "m", {CALL_ID_KWARG: _id()}, boom)
    (call,) = journaled_calls(worker)
    assert (call.state, call.done) == ("error", True)


# --------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: CallId(0, 0, "k", ranks=[0]), ConfigTypeError, "CallId: ranks must be a tuple"),  # type: ignore[arg-type]
        (lambda: CallId(0, 0, "k", ranks=(0, -1)), InvalidConfigError, r"ranks\[\.\.\.\]"),
        (lambda: arm_torn_dispatch(3), ConfigTypeError, "then must be callable"),  # type: ignore[arg-type]
        (lambda: arm_torn_dispatch(print, reach=0), InvalidConfigError, "reach must be"),
        (lambda: arm_torn_dispatch(print, reach=True), InvalidConfigError, "reach must be"),
        (lambda: arm_torn_dispatch(print, timeout_s=0), InvalidConfigError, "timeout_s"),
        (
            lambda: run_journaled(
                _Bare(), "m", {CALL_ID_KWARG: _id(), JOURNAL_LANE_KWARG: 1}, print
            ),
            ConfigTypeError,
            r"_Bare.m \(rank 2\): keyword '_sc_from_journal' is reserved for a bool",
        ),
        (
            lambda: run_journaled(_Bare(), "m", {JOURNAL_LANE_KWARG: True}, print),
            ConfigTypeError,
            "reserved for a sc_core.CallId, got NoneType",
        ),
    ],
)
def test_bad_arguments_are_refused(make: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()
    disarm_torn_dispatch()


def test_bad_scopes_are_refused(wg: LocalWorkerGroup[Any]) -> None:
    with pytest.raises(ConfigTypeError, match=r"adopt_journals: scopes must be an iterable"):
        wg.adopt_journals(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigTypeError, match=r"journaled_calls: scopes must be an iterable"):
        wg.journaled_calls("12")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match=r"adopt_journals: scopes\[\.\.\.\] must be"):
        wg.adopt_journals([-1])
    with pytest.raises(ConfigTypeError, match=r"scopes\[\.\.\.\] must be an int"):
        wg.journaled_calls([1.5])  # type: ignore[list-item]


def test_a_worker_class_that_is_not_a_worker_holds_no_journal_to_ask() -> None:
    with LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(Plain)) as group:
        group.use_call_ids(CallIds())
        assert group.hello() == ["hi", "hi"]
        assert group.journaled_calls() == [[], []]
        assert group.adopt_journals([0]) == []
        with pytest.raises(InvalidConfigError):
            group.adopt_journals([-2])


def test_an_older_driver_is_fenced_off_on_the_journal_lane_too(
    wg: LocalWorkerGroup[Any],
) -> None:
    _driver(wg, 0, 1)
    wg.step(1)
    _driver(wg, 1, 1)
    wg.adopt_journals([1])
    assert wg.step(1) == [(0, 1), (1, 1)]  # the workers saw epoch 1
    _driver(wg, 0, 1)  # the old driver again: step#0 is held, so the journal lane
    with pytest.raises(WorkerError, match="a newer driver re-attached"):
        wg.step(1)
