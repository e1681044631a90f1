"""A whole Ray node lost in the middle of an update, on a two-node cluster on this machine.

The module starts a standing cluster of two nodes with ``ray start``: a head (``--head``,
2 CPUs, custom resource ``node_a``) and, for each test, a second node joined to it (its own
raylet, temp dir and ports, 1 CPU, custom resource ``node_b``). A driver process
(``_integration_node_driver.py``, connected through ``RAY_ADDRESS``) runs a tiny PPO run
with ``nnodes=2, workers_per_role=2``: the pool is one placement group per node, one rank
on each. While the pool is placed the driver holds the head's second CPU, so the two
placement groups land on different nodes (checked: which node each rank runs on).

* With room on the head (the driver gave the held CPU back once placed): as step 3's
  ``update_actor`` begins (the driver's log line; the update runs FSDP collectives between
  the two ranks), the test loses the second node from outside, as a machine goes away: its
  raylet, its agents, its log monitor and its worker process are stopped and SIGKILLed
  together (``ClusterNode.kill``). The survivor's collective fails, the cluster declares the
  node dead after its health checks, Ray places the lost placement group on the head, and
  the run recovers in place there: the dead rank replaced on the head, every role restored
  from the step-2 checkpoint. The run must end with weights bit-identical to the same run
  never interrupted (run on the same cluster with the same layout first), every step
  recorded once, within 400 s of the kill.
* Without room (the driver keeps the CPU): the run loses the node itself, with the injected
  fault ``node@step=1:update_actor`` (sc-ray's ``NodeLoss``: the node's raylet and every
  process below it SIGKILLed as the update begins). The replacement waits for the cluster
  to declare the node dead, then for the placement up to the pool's placement deadline
  (``SC_RAY_PLACEMENT_TIMEOUT_S=20``), and the run stops with a ``TrainerRecoveryError``
  from sc-ray's ``RankPlacementTimeoutError`` naming the group, the rank and the missing
  ``CPU``, within 120 s of the loss: never a hang.

The default integration session runs the second (about two minutes with the cluster's
start-up) and the check of the two nodes' ports; the ``faults`` session runs them all.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sc_integration._cluster_node import ClusterNode
from sc_integration._standing_cluster import NODE_PORT_FLAGS, StandingCluster, cluster_ports
from sc_trainer.runs import read_metrics
from sc_trainer.testing import final_weights

pytestmark = [pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
#: the head's CPUs: one for its rank, one free for the lost node's bundle (or held)
HEAD_CPUS = 2
#: the second node's CPUs: one for its rank
NODE_CPUS = 1
#: what the driver holds while the pool is placed, so that each node gets one rank
HOLD = {"CPU": 1, "node_a": 1}
#: the run: FSDP dp=2 over two nodes, a checkpoint every two steps, long enough updates
RUN: dict[str, Any] = {
    "nnodes": 2,
    "workers_per_role": 2,
    "steps": 6,
    "save_every": 2,
    "val_every": 2,
    "ppo_epochs": 8,
}
KILL_STEP = 3
#: the driver's log line after which the node is lost: inside that step's actor update
KILL_AT = f"step {KILL_STEP}: update_actor begins"
#: how soon after the kill the run with room must end (recovered and finished)
ROOM_BOUND_S = 400
#: the run without room: short, the node lost by the run itself as step 1's update begins;
#: its placement deadline, and how soon after the loss it must end
NO_ROOM_RUN: dict[str, Any] = {
    "nnodes": 2,
    "workers_per_role": 2,
    "steps": 2,
    "inject_fault": "node@step=1:update_actor",
}
PLACEMENT_TIMEOUT_S = 20
NO_ROOM_BOUND_S = 120


@pytest.fixture(scope="module")
def head() -> Iterator[StandingCluster]:
    # Ray's socket paths must stay short: a temp dir of its own under /tmp
    with tempfile.TemporaryDirectory(prefix="sc-nl-") as tmp:
        cluster = StandingCluster(Path(tmp) / "a", num_cpus=HEAD_CPUS, resources={"node_a": 8})
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def node(head: StandingCluster) -> Iterator[ClusterNode]:
    """A second node joined to the head for one test (a lost node stays lost)."""
    with tempfile.TemporaryDirectory(prefix="sc-nl-") as tmp:
        joined = ClusterNode(head, Path(tmp) / "b", num_cpus=NODE_CPUS, resources={"node_b": 8})
        try:
            yield joined
        finally:
            joined.stop()


def _start(
    head: StandingCluster, output: Path, options: dict[str, Any], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start the driver on ``head``'s cluster; its output goes to ``output/driver.log``."""
    output.mkdir(parents=True, exist_ok=True)
    log = output / "driver.log"
    args = [sys.executable, str(HERE / "_integration_node_driver.py"), str(output)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*args, json.dumps(options)],
            env={**head.env(), **(env or {})},
            stdout=out,
            stderr=out,
        )
    return proc, log


def _wait_for_line(proc: subprocess.Popen[bytes], log: Path, line: str, timeout: float) -> None:
    """Wait until the driver's log holds ``line`` (polled every 20 ms: the node must be lost
    while the phase the line opens still runs)."""
    deadline = time.monotonic() + timeout
    needle = line.encode()
    while needle not in log.read_bytes():
        assert proc.poll() is None, f"the driver ended before {line!r}:\n{_tail(log)}"
        assert time.monotonic() < deadline, f"no {line!r} within {timeout} s:\n{_tail(log)}"
        time.sleep(0.02)


def _tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:]


def _summary(log: Path) -> dict[str, Any]:
    """The driver's last line: its JSON result."""
    last = [line for line in log.read_text().splitlines() if line.startswith("{")][-1]
    result: dict[str, Any] = json.loads(last)
    return result


def _ranks_by_node(output: Path, name: str) -> dict[str, list[str]]:
    """``{node resource: [actor names]}`` of the run's workers (spares left out), from the
    driver's ``name`` placement record; also checks the driver is on the head."""
    placement = json.loads((output / name).read_text())
    nodes = {node: tags[0] for node, tags in placement["nodes"].items() if tags}
    assert nodes[placement["driver_node"]] == "node_a", placement
    out: dict[str, list[str]] = {}
    for actor, where in sorted(placement["actors"].items()):
        if "standby" not in actor:
            out.setdefault(nodes[where], []).append(actor)
    return out


@pytest.mark.fault_matrix
def test_a_lost_node_is_recovered_on_the_surviving_node_bit_identical(
    head: StandingCluster, node: ClusterNode, tmp_path: Path
) -> None:
    options = {**RUN, "hold": HOLD, "release_hold": True}
    # the same run never interrupted, on the same cluster and layout
    clean, clean_log = _start(head, tmp_path / "clean", options)
    assert clean.wait(timeout=400) == 0, _tail(clean_log)
    placed = _ranks_by_node(tmp_path / "clean", "placement.json")
    assert sorted(placed) == ["node_a", "node_b"], placed
    assert [len(v) for v in placed.values()] == [1, 1], placed
    expected = final_weights(Path(_summary(clean_log)["checkpoint"]))
    assert expected, "the clean run's checkpoint holds no model tensor"

    out = tmp_path / "lost"
    proc, log = _start(head, out, options)
    _wait_for_line(proc, log, KILL_AT, timeout=400)
    killed = node.kill()
    kill_time = time.monotonic()
    assert node.raylet_pid() is None
    assert len(killed) >= 4, killed  # the raylet, its two agents, the log monitor, the worker
    assert proc.wait(timeout=ROOM_BOUND_S) == 0, _tail(log)
    seconds_after_kill = time.monotonic() - kill_time

    before = _ranks_by_node(out, "placement.json")
    assert [len(before.get(n, [])) for n in ("node_a", "node_b")] == [1, 1], before
    after = _ranks_by_node(out, "placement-recovery1.json")
    assert list(after) == ["node_a"], after  # both ranks on the head now
    assert len(after["node_a"]) == 2, after
    lost_rank = before["node_b"][0]
    assert lost_rank not in after["node_a"], (lost_rank, after)  # a new actor (-g1)

    history = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in history] == list(range(RUN["steps"] + 1))
    recoveries = [r for r in history if "recovery/count" in r]
    assert len(recoveries) == 1, recoveries
    recovery = recoveries[0]
    assert recovery["recovery/failed_step"] in (KILL_STEP, KILL_STEP + 1), recovery
    assert recovery["recovery/from_step"] == 2, recovery
    # the driver learns of the loss one of two ways, whichever comes first: its call to the
    # lost rank finds the actor unreachable, or the survivor's collective loses its peer (and
    # the recovery waits for the cluster to report the death)
    text = log.read_text()
    assert (
        "a collective lost its connection to a peer" in text
        or re.search(r"worker rank \d+ died", text) is not None
    ), _tail(log)

    got = final_weights(Path(_summary(log)["checkpoint"]))
    assert got.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), key
    print(  # noqa: T201 (the numbers the guide quotes; pytest -s shows them)
        f"\nnode lost in step {recovery['recovery/failed_step']}: recovery "
        f"{recovery['recovery/seconds']:.1f} s, run ended {seconds_after_kill:.1f} s after "
        f"the kill ({_summary(log)['seconds']:.1f} s in all; clean run "
        f"{_summary(clean_log)['seconds']:.1f} s)"
    )


@pytest.mark.fault_matrix  # sc-ray's tests lose a node in the default run
def test_a_lost_node_without_room_for_its_ranks_stops_the_run_with_a_clear_error(
    head: StandingCluster, node: ClusterNode, tmp_path: Path
) -> None:
    options = {**NO_ROOM_RUN, "hold": HOLD, "release_hold": False}
    env = {"SC_RAY_PLACEMENT_TIMEOUT_S": str(PLACEMENT_TIMEOUT_S)}
    proc, log = _start(head, tmp_path, options, env)
    _wait_for_line(proc, log, "injected fault node@step=1:update_actor: losing the node", 400)
    kill_time = time.monotonic()
    returncode = proc.wait(timeout=NO_ROOM_BOUND_S + 60)
    seconds_after_kill = time.monotonic() - kill_time
    text = log.read_text()
    assert returncode != 0, _tail(log)
    assert seconds_after_kill < NO_ROOM_BOUND_S, seconds_after_kill
    assert node.raylet_pid() is None  # the run lost the node: its raylet is gone

    placed = _ranks_by_node(tmp_path, "placement.json")
    ((lost,),) = [placed["node_b"]]
    rank = int(lost.rsplit("_", 1)[1].split(":")[0])  # <prefix>WorkerDict_<node index>:0
    group = lost.split("WorkerDict_")[0]
    assert "TrainerRecoveryError: step" in text, _tail(log)
    assert "the dead workers could not be replaced: RankPlacementTimeoutError" in text
    assert f"RayWorkerGroup {group!r}.replace_ranks" in text, _tail(log)
    assert f"rank {rank} (bundle 0 of node {rank} of pool [1, 1])" in text, _tail(log)
    assert f"within {PLACEMENT_TIMEOUT_S} s" in text
    assert "missing {CPU: 1}" in text, _tail(log)
    print(  # noqa: T201 (the numbers the guide quotes; pytest -s shows them)
        f"\nno room: the run stopped {seconds_after_kill:.1f} s after the kill"
    )


def test_the_two_nodes_ports_stay_out_of_each_others_worker_ranges() -> None:
    """``ray start`` refuses a component port inside its worker range, and a worker of one
    node could take a port of the other in its range: drawn many times, no port of either
    node falls in either range, and the ranges do not overlap."""
    for _ in range(200):
        head_ports, head_range = cluster_ports(2 + len(NODE_PORT_FLAGS))
        ports, workers = cluster_ports(
            len(NODE_PORT_FLAGS), taken_ports=head_ports, taken_ranges=[head_range]
        )
        every = [*head_ports, *ports]
        assert len(set(every)) == len(every)
        assert not any(port in r for port in every for r in (head_range, workers))
        assert workers.stop <= head_range.start or head_range.stop <= workers.start
        assert len(workers) == len(head_range) == 201
        assert max(workers.stop, head_range.stop) - 1 <= 65535
