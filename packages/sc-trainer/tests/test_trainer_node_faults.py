"""Injected node faults (``node[:RANK]@step=N[:PHASE[+S]]``): parsing, the config's checks, and
when the armed loss fires, with a stand-in for sc-ray's ``NodeLoss`` that records its calls.

The real loss of a node, on a two-node Ray cluster, is
``integration/tests/test_integration_node_loss.py``; sc-ray's ``NodeLoss`` itself is tried in
``packages/sc-ray/tests/test_ray_node_loss.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sc_trainer import TrainerConfigError
from sc_trainer.faults import ArmedLoss, DriverFault, FaultSpec, NodeFault, NodeFaults
from sc_trainer.testing import tiny_config
from sc_trainer.trainer import TrainerStateError

pytestmark = [pytest.mark.timeout(60)]


def test_parse() -> None:
    assert NodeFault.parse_all(None) == ()
    assert NodeFault.parse_all("actor:1@step=3, driver@step=2") == ()
    assert NodeFault.parse_all("node@step=3") == (NodeFault(3),)
    (fault,) = NodeFault.parse_all("actor:0@step=2,node:1@step=3:update_actor+0.5")
    assert (fault.step, fault.phase, fault.delay_s, fault.rank) == (3, "update_actor", 0.5, 1)
    assert str(fault) == "node:1@step=3:update_actor+0.5"
    assert str(NodeFault(4)) == "node@step=4:start"
    # the other kinds' parsers leave a node fault alone
    assert FaultSpec.parse_all("node@step=3,actor:1@step=2") == (FaultSpec("actor", 1, 2),)
    assert DriverFault.parse_all("node@step=3,driver@step=2") == (DriverFault(2),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node@step=three", "must look like"),
        ("node@step=0", "step must be >= 1"),
        ("node:x@step=2", "must look like"),
        ("node@step=2:lunch", "phase must be one of"),
        ("node@step=2:update_actor-1", "must look like"),
        ("node@step=2:start+1", "a delay needs a phase"),
    ],
)
def test_bad_faults_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(TrainerConfigError, match=message):
        NodeFault.parse_all(text)


def test_the_config_asks_for_ray_and_a_rank_of_the_role(tmp_path: Path) -> None:
    with pytest.raises(TrainerConfigError, match="losing a node needs the Ray backend"):
        tiny_config(tmp_path, backend="local", inject_fault="node@step=2")
    with pytest.raises(TrainerConfigError, match="actor rank 2 is outside the 2 workers"):
        tiny_config(tmp_path, backend="ray", workers_per_role=2, inject_fault="node:2@step=2")
    config = tiny_config(tmp_path, backend="ray", inject_fault="node@step=2:update_actor+0.1")
    assert config.node_faults == (NodeFault(2, "update_actor", 0.1),)
    assert config.faults == ()  # not a worker's fault


class _Loss:
    """Records when it is fired or cancelled; ``fail`` makes ``fire`` raise."""

    def __init__(self, fault: NodeFault, log: list[str], fail: bool) -> None:
        self.fault = fault
        self.log = log
        self.fail = fail

    def fire(self) -> None:
        self.log.append(f"fire {self.fault}")
        if self.fail:
            raise RuntimeError("the killer did not start")

    def cancel(self) -> None:
        self.log.append(f"cancel {self.fault}")


def _arm(log: list[str], fail: bool = False) -> Callable[[NodeFault], ArmedLoss]:
    """What the trainer arms a fault with (sc-ray's ``NodeLoss.of_rank``), recorded."""

    def arm(fault: NodeFault) -> ArmedLoss:
        log.append(f"arm {fault}")
        return _Loss(fault, log, fail)

    return arm


def test_armed_as_the_step_begins_fired_in_its_phase_once() -> None:
    log: list[str] = []
    arm = _arm(log)
    faults = NodeFaults(NodeFault.parse_all("node@step=2,node:1@step=3:update_actor"))
    faults.arm(1, arm)
    assert log == []  # nothing due at step 1
    faults.arm(2, arm)
    assert log == ["arm node@step=2:start", "fire node@step=2:start"]  # no phase: at once
    log.clear()
    faults.arm(3, arm)
    assert log == ["arm node:1@step=3:update_actor"]
    with faults.phase(3, "generate"):
        pass
    assert log == ["arm node:1@step=3:update_actor"]
    with faults.phase(3, "update_actor"):
        log.append("inside")
    assert log == ["arm node:1@step=3:update_actor", "fire node:1@step=3:update_actor", "inside"]
    log.clear()
    faults.arm(3, arm)  # the step again, after a recovery: each fault fires once
    with faults.phase(3, "update_actor"):
        pass
    faults.close()
    assert log == []


def test_a_delay_fires_inside_a_long_phase_or_as_a_short_one_ends() -> None:
    log: list[str] = []
    arm = _arm(log)
    faults = NodeFaults(
        NodeFault.parse_all("node@step=1:update_actor+0.2,node@step=2:update_actor+30")
    )
    faults.arm(1, arm)
    with faults.phase(1, "update_actor"):
        started = time.monotonic()
        while "fire node@step=1:update_actor+0.2" not in log:  # from the timer thread
            assert time.monotonic() - started < 10, log
            time.sleep(0.01)
        assert time.monotonic() - started >= 0.15
        log.append("still inside")
    assert log == [
        "arm node@step=1:update_actor+0.2",
        "fire node@step=1:update_actor+0.2",
        "still inside",
    ]
    log.clear()
    faults.arm(2, arm)
    with faults.phase(2, "update_actor"):
        log.append("short phase")
    assert log == [
        "arm node@step=2:update_actor+30",
        "short phase",
        "fire node@step=2:update_actor+30",  # as the phase ends, not 30 s later
    ]


def test_an_armed_loss_never_fired_is_cancelled_and_a_failed_one_is_an_error() -> None:
    log: list[str] = []
    faults = NodeFaults(NodeFault.parse_all("node@step=2:validate"))
    faults.arm(2, _arm(log))
    faults.close()  # the run ended before the phase
    assert log == ["arm node@step=2:validate", "cancel node@step=2:validate"]

    failing = NodeFaults(NodeFault.parse_all("node@step=1,node@step=2:update_actor+0.05"))
    arm = _arm([], fail=True)
    with pytest.raises(TrainerStateError, match="node@step=1:start: the node was not lost"):
        failing.arm(1, arm)
    failing.arm(2, arm)
    with (
        pytest.raises(TrainerStateError, match="the killer did not start"),
        failing.phase(2, "update_actor"),
    ):
        time.sleep(0.2)  # the timer fires (and fails) inside the phase
