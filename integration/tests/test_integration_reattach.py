"""A driver killed at any point of a detached run, and a new one that re-attaches.

The module starts a standing local Ray cluster of its own (``ray start --head`` with its own
temp dir and ports). Each case runs a tiny detached PPO run (FSDP dp=2, four steps, a
checkpoint every two) as a driver process that kills itself with SIGKILL at an injected
point (``driver@step=N:PHASE[+S]``: as a step begins, inside a generation, an update, a
weight sync, a checkpoint write, a validation), then starts a second driver with the same
run id, which re-attaches to the live workers and finishes the run. In every case:

* the final weights equal, bit for bit, those of the same run never interrupted;
* no worker process was restarted: the workers' pids the second driver found are the
  first driver's (``run_drivers.jsonl``);
* every step's metrics are recorded once;
* the second driver took over the fault's step, and for a fault inside a phase the
  workers had run that phase's call for the first driver in the step (the kill came after
  the call was sent; ``DriverFaults`` makes it come before the phase ends).

A driver killed while it hands a call out (``driver@step=N:PHASE+torn``: the call reached
rank 0, which runs it inside a collective, and never rank 1) leaves a torn call: the second
driver finds it in the journals and its replay completes it, without taking the busy rank
as lost, replacing a process or restoring a checkpoint.

The default integration session runs three cases (inside an update, inside the weight sync
of a separate rollout, a torn update); the ``faults`` session runs them all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from sc_trainer.faults import DriverFault
from sc_trainer.testing import final_weights

pytestmark = [pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
STEPS = 4
#: what every run of the module shares (besides its placement): two ranks per role
BASE: dict[str, Any] = {"workers_per_role": 2, "steps": STEPS, "save_every": 2, "val_every": 2}


@dataclass(frozen=True)
class Case:
    """One killed driver: where, and the run's placement."""

    fault: str
    layout: str = "colocated"
    options: dict[str, Any] = field(default_factory=dict, hash=False)

    def __str__(self) -> str:
        return f"{self.layout}-{self.fault.removeprefix('driver@')}"


LAYOUTS: dict[str, dict[str, Any]] = {
    "colocated": {},
    "separate": {"placement": "separate"},
    "async": {"placement": "separate", "async_staleness": 1},
    "critic-pool": {"colocate": False},
}

CASES = [
    Case("driver@step=2"),  # as a step begins, before its first call
    Case("driver@step=2:generate+0.05"),  # inside a generation
    Case("driver@step=3:update_actor+0.05"),  # inside the actor's update
    Case("driver@step=2:save_checkpoint+0.02"),  # while the workers write a checkpoint
    Case("driver@step=4:validate+0.02"),  # inside the last validation
    Case("driver@step=3:sync_weights", "separate"),  # between the update and the sync
    Case("driver@step=2:sync_weights+0.02", "separate"),  # inside a weight sync
    Case("driver@step=3:update_actor+0.05", "async"),  # async, staleness 1: inside an update
    Case("driver@step=3:generate+0.02", "async"),  # async: taking the prefetched batch
    Case("driver@step=2:update_critic+0.05", "critic-pool"),  # a critic on its own processes
]
#: the cases the default integration session runs (inside an update; inside a weight sync)
DEFAULT = {2, 6}


class _Cluster:
    def __init__(self, tmp: Path) -> None:
        from sc_integration._standing_cluster import StandingCluster

        self.cluster = StandingCluster(tmp)
        self.counter = 0

    def run_id(self) -> str:
        self.counter += 1
        return f"t{os.getpid()}-{self.counter}"

    def driver(self, output: Path, options: dict[str, Any], timeout: float = 300) -> Any:
        """Run one driver process to its end: (returncode, stdout, stderr)."""
        args = [sys.executable, str(HERE / "_integration_driver.py"), str(output)]
        return subprocess.run(
            [*args, json.dumps(options)],
            env=self.cluster.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def cluster() -> Iterator[_Cluster]:
    # Ray's socket paths must stay short: a temp dir of its own under /tmp
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sc-ra-") as tmp:
        standing = _Cluster(Path(tmp))
        try:
            yield standing
        finally:
            standing.cluster.stop()


@pytest.fixture(scope="module")
def clean(cluster: _Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The final checkpoint of each layout's run never interrupted (detached too), made on
    first use."""
    done: dict[str, Path] = {}

    class Lazy(dict[str, Path]):
        def __missing__(self, layout: str) -> Path:
            out = tmp_path_factory.mktemp(f"clean-{layout}")
            options = {**BASE, **LAYOUTS[layout], "run": {"id": cluster.run_id()}}
            proc = cluster.driver(out, options)
            assert proc.returncode == 0, proc.stderr[-3000:]
            done[layout] = Path(json.loads(proc.stdout.strip().splitlines()[-1])["checkpoint"])
            return done[layout]

    return Lazy()


def _drivers(output: Path) -> list[dict[str, Any]]:
    lines = (output / "run_drivers.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=() if i in DEFAULT else pytest.mark.fault_matrix)
        for i, c in enumerate(CASES)
    ],
    ids=str,
)
def test_a_killed_driver_is_replaced_by_one_that_reattaches(
    case: Case, cluster: _Cluster, clean: dict[str, Path], tmp_path: Path
) -> None:
    from sc_trainer.runs import read_metrics

    expected = final_weights(clean[case.layout])
    options = {**BASE, **LAYOUTS[case.layout], "run": {"id": cluster.run_id()}}
    first = cluster.driver(tmp_path, {**options, "inject_fault": case.fault})
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr[-3000:])
    second = cluster.driver(tmp_path, options)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "re-attached" in second.stderr
    result = json.loads(second.stdout.strip().splitlines()[-1])
    got = final_weights(Path(result["checkpoint"]))
    assert got.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), (case, key)
    drivers = _drivers(tmp_path)
    _check_killed_inside(case, drivers[1])
    assert [d["epoch"] for d in drivers] == [1, 2]
    assert [d["attached"] for d in drivers] == [False, True]
    assert drivers[1]["workers"] == drivers[0]["workers"], "a worker process was restarted"
    history = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in history] == list(range(STEPS + 1))


#: Drivers killed while they hand a call out (``+torn``): the call reached rank 0, which runs
#: it (inside a collective, waiting for rank 1), and never rank 1. The first runs in the
#: default integration session.
TORN_CASES = [
    Case("driver@step=3:update_actor+torn"),  # the actor's update: FSDP's collectives
    Case("driver@step=2:generate+torn"),  # a generation, colocated
    Case("driver@step=2:update_critic+torn", "critic-pool"),  # the critic on its own processes
]
#: the bound on each driver of a torn case (seconds): a driver that hangs (the busy rank
#: never answers, the torn call never completes) fails the case here, not at pytest's
#: timeout; each took 21 to 45 s on the project's loaded 2-core machine
TORN_DRIVER_BOUND_S = 240.0


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=() if i == 0 else pytest.mark.fault_matrix)
        for i, c in enumerate(TORN_CASES)
    ],
    ids=str,
)
def test_a_call_torn_by_a_killed_driver_is_completed_by_the_next_driver(
    case: Case, cluster: _Cluster, clean: dict[str, Path], tmp_path: Path
) -> None:
    """The first driver dies while it hands a call to a group out: rank 0 runs it, rank 1
    never got it. The second driver asks the journals before anything else, finds the torn
    call, and its replay completes it (rank 1 runs it, rank 0 answers from its journal):
    no rank is taken as lost (the busy rank answers on its control lane), no process is
    replaced, no checkpoint restored, every step recorded once, and the final weights are
    those of the run never interrupted, bit for bit."""
    from sc_trainer.runs import read_metrics

    expected = final_weights(clean[case.layout])
    options = {**BASE, **LAYOUTS[case.layout], "run": {"id": cluster.run_id()}}
    first = cluster.driver(
        tmp_path, {**options, "inject_fault": case.fault}, timeout=TORN_DRIVER_BOUND_S
    )
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr[-3000:])
    assert "injected torn dispatch" in first.stderr, first.stderr[-3000:]
    started = time.monotonic()
    second = cluster.driver(tmp_path, options, timeout=TORN_DRIVER_BOUND_S)
    second_s = time.monotonic() - started
    assert second.returncode == 0, second.stderr[-3000:]
    result = json.loads(second.stdout.strip().splitlines()[-1])
    got = final_weights(Path(result["checkpoint"]))
    assert got.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), (case, key)
    drivers = _drivers(tmp_path)
    assert [d["epoch"] for d in drivers] == [1, 2]
    assert drivers[1]["workers"] == drivers[0]["workers"], "a worker process was replaced"
    (fault,) = DriverFault.parse_all(case.fault)
    assert drivers[1]["took_over"]["step"] == fault.step
    torn = drivers[1]["torn_calls"]
    assert torn, (case, drivers[1])
    for call in torn:
        assert PHASE_METHODS[fault.phase] in call["method"], (case, call)
        assert call["missing"] == [1], (case, call)
        assert list(call["held"]) == ["0"], (case, call)
    assert "taken as dead" not in second.stderr
    history = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in history] == list(range(STEPS + 1))
    assert not any("recovery/count" in r for r in history), "a checkpoint was restored"
    # before: 30 s waiting for the busy rank's fingerprint, then a recovery
    assert result["startup_seconds"] < 20, result
    print(  # noqa: T201 - the measurement the guide quotes (pytest -s shows it)
        f"{case}: second driver {second_s:.1f} s in all, at its first step "
        f"{result['startup_seconds']:.2f} s after it started"
    )


#: the worker method each phase a fault names calls (by a part of its name)
PHASE_METHODS = {
    "generate": "generate_sequences",
    "update_actor": "update_actor",
    "update_critic": "update_critic",
    "sync_weights": "sync_",
    "validate": "generate_sequences",
    "save_checkpoint": "save_checkpoint",
}


def _check_killed_inside(case: Case, second: dict[str, Any]) -> None:
    """The second driver took over the fault's step; for a fault inside a phase (a delay),
    the workers had run the phase's call for the first driver in that step's scope: the
    kill came after the call was sent (and, by ``DriverFaults``, before the phase ended)."""
    (fault,) = DriverFault.parse_all(case.fault)
    took_over = second["took_over"]
    assert took_over is not None
    assert took_over["step"] == fault.step, (case, took_over)
    if not fault.delay_s or (case.layout == "async" and fault.phase == "generate"):
        return  # killed before the phase's call, or the call ran in the launch's own scope
    method = PHASE_METHODS[fault.phase]
    ran = [
        (group, name, record)
        for group, ranks in second["last_calls"].items()
        for rank in ranks or []
        for name, record in rank.items()
        if method in name and record[0] == 1 and record[1] == took_over["scope"]
    ]
    assert ran, (case, took_over, second["last_calls"])


# --- bad re-attaches, teardown, abandonment ----------------------------------------------

_LEFT = """
import json
from sc_trainer.launch._connect import connect_to_cluster
ray = connect_to_cluster(None, namespace="sc-probe", log_to_driver=False)  # as a driver would
ns = "sc-run-" + RUN_ID
actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
          if a["namespace"] == ns]
pgs = [p["name"] for p in ray.util.placement_group_table().values()
       if p["name"].startswith(ns) and p["state"] != "REMOVED"]
print(json.dumps({"actors": actors, "placement_groups": pgs}))
"""


def _left(cluster: _Cluster, run_id: str) -> dict[str, list[str]]:
    """The run's named actors alive and its placement groups not removed, as the cluster's
    state (GCS) reports them, asked from a process of its own."""
    code = _LEFT.replace("RUN_ID", repr(run_id))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=cluster.cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    left: dict[str, list[str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return left


def _teardown(cluster: _Cluster, run_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sc_trainer.cli", "--teardown", run_id],
        env=cluster.cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_second_driver_is_refused_while_the_first_lives_and_teardown_releases_all(
    cluster: _Cluster, tmp_path: Path
) -> None:
    from sc_integration._standing_cluster import wait_for

    run_id = cluster.run_id()
    options = {**BASE, "steps": 200, "save_every": 100, "val_every": 100, "run": {"id": run_id}}
    args = [sys.executable, str(HERE / "_integration_driver.py"), str(tmp_path / "out")]
    with (tmp_path / "first.log").open("wb") as log:
        first = subprocess.Popen(
            [*args, json.dumps(options)], env=cluster.cluster.env(), stdout=log, stderr=log
        )
    try:
        wait_for(tmp_path / "out" / "run_drivers.jsonl", timeout=240)
        second = cluster.driver(tmp_path / "out", options, timeout=120)
        assert second.returncode != 0
        assert "RunInUseError" in second.stderr, second.stderr[-2000:]
        assert first.poll() is None, "the refused re-attach stopped the first driver"
    finally:
        first.kill()
        first.wait(timeout=60)
    assert _left(cluster, run_id)["actors"], "the run's workers outlive their driver"
    down = _teardown(cluster, run_id)
    assert down.returncode == 0, down.stderr[-2000:]
    assert f"run {run_id} torn down" in down.stdout
    assert _left(cluster, run_id) == {"actors": [], "placement_groups": []}


def test_unknown_run_ids_are_errors(cluster: _Cluster, tmp_path: Path) -> None:
    down = _teardown(cluster, "no-such-run")
    assert down.returncode == 1
    assert "no-such-run" in down.stderr
    attach = cluster.driver(tmp_path, {**BASE, "run": {"id": "no-such-run", "attach": True}})
    assert attach.returncode != 0
    assert "UnknownRunError" in attach.stderr
    assert "no-such-run" in attach.stderr
    assert _left(cluster, "no-such-run") == {"actors": [], "placement_groups": []}


def test_a_driver_with_another_configuration_is_refused_and_changes_nothing(
    cluster: _Cluster, clean: dict[str, Path], tmp_path: Path
) -> None:
    expected = final_weights(clean["colocated"])
    options = {**BASE, "run": {"id": cluster.run_id()}}
    first = cluster.driver(tmp_path, {**options, "inject_fault": "driver@step=2"})
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    other = cluster.driver(tmp_path, {**options, "actor_lr": 0.5})
    assert other.returncode != 0
    assert "RunMismatchError" in other.stderr, other.stderr[-3000:]
    assert "lr" in other.stderr
    right = cluster.driver(tmp_path, options)
    assert right.returncode == 0, right.stderr[-3000:]
    got = final_weights(Path(json.loads(right.stdout.strip().splitlines()[-1])["checkpoint"]))
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), key
    # the refused driver took no epoch of its own that the workers saw run anything
    drivers = _drivers(tmp_path)
    assert drivers[-1]["workers"] == drivers[0]["workers"]


def test_a_worker_lost_while_no_driver_is_attached_is_recovered_in_place(
    cluster: _Cluster, clean: dict[str, Path], tmp_path: Path
) -> None:
    from sc_trainer.runs import read_metrics

    expected = final_weights(clean["colocated"])
    options = {**BASE, "run": {"id": cluster.run_id()}}
    first = cluster.driver(tmp_path, {**options, "inject_fault": "driver@step=3"})
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    (pids,) = _drivers(tmp_path)[0]["workers"].values()
    os.kill(pids[1], signal.SIGKILL)
    second = cluster.driver(tmp_path, options)
    assert second.returncode == 0, second.stderr[-3000:]
    got = final_weights(Path(json.loads(second.stdout.strip().splitlines()[-1])["checkpoint"]))
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), key
    history = read_metrics(tmp_path / "metrics.jsonl")
    assert sum("recovery/count" in r for r in history) == 1
    assert [r["step"] for r in history] == list(range(STEPS + 1))


def test_an_abandoned_run_releases_itself(cluster: _Cluster, tmp_path: Path) -> None:

    run_id = cluster.run_id()
    options = {**BASE, "run": {"id": run_id, "abandon_s": 4.0}}
    first = cluster.driver(tmp_path, {**options, "inject_fault": "driver@step=2"})
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    # the watchdog acts 4 s after the driver's death; the bound is for the probes, each a
    # Python process that connects to the cluster (slow on a loaded two-core machine)
    deadline = time.monotonic() + 150
    while _left(cluster, run_id) != {"actors": [], "placement_groups": []}:
        assert time.monotonic() < deadline, _left(cluster, run_id)
        time.sleep(2)
