"""AttachedDriver: the call scopes a detached run's driver opens, replays and keeps (no Ray).

A fake run stands in for sc-ray's ``RayRun`` (only its id, epoch and whether it was
re-attached are read). The ids the driver's ``CallIds`` issue are what the workers key
their journals by, so the tests read them back through ``call_ids.next``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from sc_core import (
    ClassWithInitArgs,
    InjectedFaultError,
    LocalWorkerGroup,
    ResourcePool,
    Worker,
)
from sc_core.ext import arm_torn_dispatch
from sc_dispatch import Dispatch, register
from sc_trainer.rollout import RolloutSnapshot, ServersSnapshot
from sc_trainer.runs import DRIVERS_LOG, AttachedDriver, RunState, RunStateNotFoundError
from sc_trainer.trainer import TrainerStateError


@dataclass
class _Run:
    run_id: str = "r1"
    epoch: int = 1
    attached: bool = False


def _state(step: int, scope: int, launched: tuple[int, int] | None = None) -> RunState:
    if launched is None:
        return RunState(run_id="r1", step=step, scope=scope, global_step=step - 1)
    rollout = RolloutSnapshot(1, {1: 0}, 0, launched[0])
    return RunState(
        run_id="r1",
        step=step,
        scope=scope,
        global_step=step - 1,
        rollout=rollout,
        launched_scope=launched[1],
    )


def _scope_of_next_call(driver: AttachedDriver) -> int:
    return driver.call_ids.next("actor", "update_actor").scope


def test_each_step_and_each_launch_gets_a_new_scope(tmp_path: Path) -> None:
    driver = AttachedDriver(_Run(), tmp_path)
    assert driver.call_ids.epoch == 1
    assert driver.begin_step() == 1
    assert _scope_of_next_call(driver) == 1
    with driver.launch_scope(2):
        assert _scope_of_next_call(driver) == 2
    assert _scope_of_next_call(driver) == 1  # back in the step's scope
    with driver.launch_scope(2):  # the same generation asked again: the same scope
        assert _scope_of_next_call(driver) == 2
    assert driver.begin_step() == 3


def test_a_replayed_step_reuses_its_scope_and_the_pending_launch(tmp_path: Path) -> None:
    driver = AttachedDriver(_Run(epoch=2, attached=True), tmp_path)
    driver.replay_from(_state(step=4, scope=9, launched=(4, 8)))
    assert driver.begin_step() == 9  # the interrupted step, under its own scope
    assert driver.launch_pending(4) == 4  # step 4's generation is pending
    with driver.launch_scope(4):
        call = driver.call_ids.next("rollout", "generate_sequences")
    assert (call.epoch, call.scope, call.key) == (2, 8, "generate_sequences#0")
    assert driver.begin_step() == 10  # later steps go on after the replayed one


def test_launch_pending_names_the_earliest_step_not_taken(tmp_path: Path) -> None:
    driver = AttachedDriver(_Run(), tmp_path)
    assert driver.launch_pending(1) is None
    driver.begin_step()
    with driver.launch_scope(3):
        pass
    with driver.launch_scope(5):
        pass
    assert driver.launch_pending(1) == 3
    assert driver.launch_pending(4) == 5
    assert driver.launch_pending(6) is None
    driver.forget_launches()
    assert driver.launch_pending(1) is None
    with driver.launch_scope(3):  # forgotten: generated afresh under a new scope
        assert _scope_of_next_call(driver) == 4


def test_write_keeps_the_pending_launch_in_the_workers_journals(tmp_path: Path) -> None:
    driver = AttachedDriver(_Run(), tmp_path)
    for _ in range(7):
        driver.begin_step()
    with driver.launch_scope(4):
        pass  # scope 8
    driver.write(_state(step=3, scope=7, launched=(4, 8)))
    assert driver.call_ids.keep_from == 7  # the step's scope is older than the launch
    driver.write(_state(step=4, scope=9, launched=(4, 8)))
    assert driver.call_ids.keep_from == 8  # the launch is older than the step
    assert driver.launch_pending(4) == 4
    driver.write(_state(step=5, scope=10))  # nothing launched: launch scopes are forgotten
    assert driver.call_ids.keep_from == 10
    assert driver.launch_pending(4) is None


def test_read_state(tmp_path: Path) -> None:
    driver = AttachedDriver(_Run(attached=True), tmp_path)
    with pytest.raises(RunStateNotFoundError):
        driver.read_state()  # no driver of this run wrote here
    (tmp_path / DRIVERS_LOG).write_text("{}\n")
    assert driver.read_state() is None  # the driver died before its first step
    state = _state(step=2, scope=3)
    driver.write(state)
    assert driver.read_state() == state


class _Counting(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.ran = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update(self, x: int) -> tuple[int, int]:
        self.ran += 1
        return x, self.ran

    def runs(self) -> int:
        """How often ``update`` ran here (a plain call: no id, so not journaled)."""
        return self.ran


def test_a_reattached_driver_asks_the_journals_first_and_records_torn_calls(
    tmp_path: Path,
) -> None:
    """The first driver hands ``update`` to rank 0 only (a torn dispatch); the next asks the
    journals of the step it replays, records the torn call, and its replay completes it:
    rank 1 runs it, rank 0 answers from its journal."""
    with LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(_Counting)) as group:
        first = AttachedDriver(_Run(epoch=1), tmp_path)
        first.use_on([group])
        scope = first.begin_step()
        first.write(_state(step=1, scope=scope))
        arm_torn_dispatch(lambda: None)
        with pytest.raises(InjectedFaultError, match="torn dispatch"):
            group.update(3)
        # a rank runs its calls in order: this answers once rank 0 has finished ``update``
        # (so its journal holds "ok", not "running"); rank 1 never received it
        assert group.execute_all_sync("runs") == [1, 0]
        second = AttachedDriver(_Run(epoch=2, attached=True), tmp_path)
        second.use_on([group])
        state = second.read_state()
        assert state is not None
        (torn,) = second.adopt_journals([group], state)
        assert (torn.method, dict(torn.held), torn.missing) == ("update", {0: "ok"}, (1,))
        second.record_driver([group], state)
        record = json.loads((tmp_path / DRIVERS_LOG).read_text().splitlines()[-1])
        assert record["torn_calls"] == [
            {
                "group": group.name_prefix,
                "scope": scope,
                "key": "update#0",
                "method": "update",
                "held": {"0": "ok"},
                "missing": [1],
            }
        ]
        second.replay_from(state)
        assert second.begin_step() == scope
        assert group.update(3) == [(3, 1), (3, 1)]  # once on each rank
        assert second.adopt_journals([group], None) == []  # scope 0: nothing held


def test_the_servers_snapshot_survives_the_run_state(tmp_path: Path) -> None:
    """A run on engine servers writes the fleet's names and the push bookkeeping; JSON's
    string keys and lists come back as the snapshot's ints and tuples."""
    servers = ServersSnapshot(
        names=("builtin-0", "builtin-1"),
        last_push=5,
        weights_path=str(tmp_path / "weights" / "v5"),
        recent_paths=(str(tmp_path / "weights" / "v4"), str(tmp_path / "weights" / "v5")),
        actor_version_of={5: 3},
    )
    state = RunState(
        run_id="r1", step=4, scope=7, global_step=3, rollout=RolloutSnapshot(servers=servers)
    )
    driver = AttachedDriver(_Run(), tmp_path)
    driver.write(state)
    (tmp_path / DRIVERS_LOG).write_text("{}\n")
    assert AttachedDriver(_Run(attached=True), tmp_path).read_state() == state


def test_amend_driver_adds_to_this_drivers_line_only(tmp_path: Path) -> None:
    driver = AttachedDriver(_Run(), tmp_path)
    with pytest.raises(TrainerStateError, match=r"amend_driver.*record_driver first"):
        driver.amend_driver(servers={"builtin-0": 1})
    driver.record_driver([], None)
    driver.amend_driver(servers={"builtin-0": 11}, adopted_servers=[])
    (line,) = (tmp_path / DRIVERS_LOG).read_text().splitlines()
    record = json.loads(line)
    assert record["servers"] == {"builtin-0": 11}
    assert record["adopted_servers"] == []
    assert record["epoch"] == 1
    assert record["spares"] == {}
