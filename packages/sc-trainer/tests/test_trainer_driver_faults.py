"""Injected driver faults (``driver@step=N[:PHASE[+S|+torn]]``): parsing, and where the kill
lands.

A fault kills the process it runs in with SIGKILL, so each kill runs in a child process that
prints a line as it passes each point; what it printed says where it died.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
from sc_trainer import TrainerConfigError
from sc_trainer.faults import DRIVER_PHASES, DriverFault

pytestmark = [pytest.mark.timeout(120)]


def test_parse() -> None:
    assert DriverFault.parse_all(None) == ()
    assert DriverFault.parse_all("actor:1@step=3") == ()  # a worker's fault: not the driver's
    assert DriverFault.parse_all("driver@step=3, actor:1@step=2") == (DriverFault(3),)
    (fault,) = DriverFault.parse_all("driver@step=2:update_actor+0.25")
    assert (fault.step, fault.phase, fault.delay_s) == (2, "update_actor", 0.25)
    assert str(fault) == "driver@step=2:update_actor+0.25"
    assert str(DriverFault(4)) == "driver@step=4:start"
    (torn,) = DriverFault.parse_all("driver@step=3:update_actor+torn")
    assert (torn.step, torn.phase, torn.delay_s, torn.torn) == (3, "update_actor", 0.0, True)
    assert str(torn) == "driver@step=3:update_actor+torn"
    assert "start" in DRIVER_PHASES
    assert "sync_weights" in DRIVER_PHASES


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("driver@step=three", "must look like"),
        ("driver@step=0", "step must be >= 1"),
        ("driver@step=2:lunch", "phase must be one of"),
        ("driver@step=2:update_actor-1", "must look like"),
        ("driver@step=2:update_actor+tron", "must look like"),
        ("driver@step=2:start+torn", "a torn dispatch"),
    ],
)
def test_bad_faults_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(TrainerConfigError, match=message):
        DriverFault.parse_all(text)


_CHILD = """
import time
from sc_trainer.faults import DriverFault, DriverFaults

faults = DriverFaults(DriverFault.parse_all(FAULT))
print("before", flush=True)
faults.at(1, "start")
print("started", flush=True)
with faults.phase(2, "update_actor"):
    print("inside", flush=True)
    time.sleep(PHASE_S)
    print("phase done", flush=True)
print("after", flush=True)
with faults.phase(2, "update_actor"):  # each fault fires once
    pass
print("end", flush=True)
"""


def _child(fault: str | None, phase_s: float) -> tuple[int, list[str]]:
    code = textwrap.dedent(_CHILD).replace("FAULT", repr(fault)).replace("PHASE_S", repr(phase_s))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout.split()


def test_no_fault_runs_through() -> None:
    assert _child(None, 0.0) == (
        0,
        ["before", "started", "inside", "phase", "done", "after", "end"],
    )
    assert _child("driver@step=9:update_actor", 0.0)[0] == 0  # another step


def test_a_fault_without_delay_kills_as_its_phase_begins() -> None:
    assert _child("driver@step=1", 0.0) == (-signal.SIGKILL, ["before"])
    code, printed = _child("driver@step=2:update_actor", 0.0)
    assert (code, printed) == (-signal.SIGKILL, ["before", "started"])


def test_a_delayed_fault_kills_inside_a_long_phase() -> None:
    code, printed = _child("driver@step=2:update_actor+0.2", 30.0)
    assert (code, printed) == (-signal.SIGKILL, ["before", "started", "inside"])


def test_a_delayed_fault_kills_as_a_short_phase_ends() -> None:
    # the phase ends long before the delay: the kill comes as it ends, never after it
    code, printed = _child("driver@step=2:update_actor+30", 0.0)
    assert code == -signal.SIGKILL
    assert printed == ["before", "started", "inside", "phase", "done"]


def test_a_torn_fault_whose_phase_hands_nothing_out_kills_as_the_phase_ends() -> None:
    # no call of the phase goes to several ranks (here: none at all): not torn, killed at
    # the end of the phase all the same (a torn call is tested on workers in sc-core and in
    # the re-attach matrix)
    code, printed = _child("driver@step=2:update_actor+torn", 0.0)
    assert code == -signal.SIGKILL
    assert printed == ["before", "started", "inside", "phase", "done"]
