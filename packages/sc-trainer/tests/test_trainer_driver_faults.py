"""Injected driver faults (``driver@step=N[:PHASE[+S|+torn]]``): parsing, and where the kill
lands.

A fault kills the process it runs in with SIGKILL, so each kill runs in a child process that
prints a line as it passes each point; what it printed says where it died. One process
imports the package and forks the children (each import costs seconds).
"""

from __future__ import annotations

import json
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


#: each case: the fault, and how long the child stays inside its ``update_actor`` phase
CASES = [
    (None, 0.0),
    ("driver@step=9:update_actor", 0.0),
    ("driver@step=1", 0.0),
    ("driver@step=2:update_actor", 0.0),
    ("driver@step=2:update_actor+0.2", 30.0),
    ("driver@step=2:update_actor+30", 0.0),
    ("driver@step=2:update_actor+torn", 0.0),
]

#: one process imports sc_trainer once (seconds), then forks a child per case: a fault kills
#: its child only, and the parent reports each child's exit and what it printed
_CHILDREN = """
import json, os, sys, time
from sc_trainer.faults import DriverFault, DriverFaults

def scenario(fault, phase_s):
    faults = DriverFaults(DriverFault.parse_all(fault))
    print("before", flush=True)
    faults.at(1, "start")
    print("started", flush=True)
    with faults.phase(2, "update_actor"):
        print("inside", flush=True)
        time.sleep(phase_s)
        print("phase done", flush=True)
    print("after", flush=True)
    with faults.phase(2, "update_actor"):  # each fault fires once
        pass
    print("end", flush=True)

results = []
for fault, phase_s in json.loads(sys.argv[1]):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.dup2(write_end, 1)
        scenario(fault, phase_s)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        printed = pipe.read().split()
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    results.append([fault, code, printed])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def outcomes() -> dict[str | None, tuple[int, list[str]]]:
    """Per fault: the exit code of its child (``-SIGKILL`` when killed) and the words it
    printed."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHILDREN), json.dumps(CASES)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {fault: (code, printed) for fault, code, printed in json.loads(proc.stdout)}


def test_no_fault_runs_through(outcomes: dict[str | None, tuple[int, list[str]]]) -> None:
    assert outcomes[None] == (0, ["before", "started", "inside", "phase", "done", "after", "end"])
    assert outcomes["driver@step=9:update_actor"][0] == 0  # another step


def test_a_fault_without_delay_kills_as_its_phase_begins(
    outcomes: dict[str | None, tuple[int, list[str]]],
) -> None:
    assert outcomes["driver@step=1"] == (-signal.SIGKILL, ["before"])
    code, printed = outcomes["driver@step=2:update_actor"]
    assert (code, printed) == (-signal.SIGKILL, ["before", "started"])


def test_a_delayed_fault_kills_inside_a_long_phase(
    outcomes: dict[str | None, tuple[int, list[str]]],
) -> None:
    code, printed = outcomes["driver@step=2:update_actor+0.2"]  # 30 s inside the phase
    assert (code, printed) == (-signal.SIGKILL, ["before", "started", "inside"])


def test_a_delayed_fault_kills_as_a_short_phase_ends(
    outcomes: dict[str | None, tuple[int, list[str]]],
) -> None:
    # the phase ends long before the delay: the kill comes as it ends, never after it
    code, printed = outcomes["driver@step=2:update_actor+30"]
    assert code == -signal.SIGKILL
    assert printed == ["before", "started", "inside", "phase", "done"]


def test_a_torn_fault_whose_phase_hands_nothing_out_kills_as_the_phase_ends(
    outcomes: dict[str | None, tuple[int, list[str]]],
) -> None:
    # no call of the phase goes to several ranks (here: none at all): not torn, killed at
    # the end of the phase all the same (a torn call is tested on workers in sc-core and in
    # the re-attach matrix)
    code, printed = outcomes["driver@step=2:update_actor+torn"]
    assert code == -signal.SIGKILL
    assert printed == ["before", "started", "inside", "phase", "done"]
