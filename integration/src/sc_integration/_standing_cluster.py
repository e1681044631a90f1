"""A standing local Ray cluster, for the re-attach and node-loss tests and benchmark (not
public API).

:class:`StandingCluster` runs ``ray start --head`` with a temp dir and ports of its own
(nothing shared with another cluster on the machine) and stops every process it started
by that temp dir or its GCS port, and the processes below them; :func:`run_driver` runs
``sc-demo`` as a separate driver process on it, so a test can SIGKILL a driver and start
another. A second node joins it with :class:`~sc_integration._cluster_node.ClusterNode`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sc_core import backend

__all__ = [
    "NODE_PORT_FLAGS",
    "START_TRIES",
    "Driver",
    "StandingCluster",
    "cluster_ports",
    "free_port",
    "kill_processes",
    "node_ports",
    "processes_where",
    "run_driver",
    "run_ray_start",
    "start_driver",
    "start_with_retries",
    "wait_for",
]


def free_port() -> int:
    """A port free on 127.0.0.1 (the standing cluster binds there)."""
    return backend.free_port("127.0.0.1")


_WORKER_PORTS = 200


def cluster_ports(
    count: int, *, taken_ports: Collection[int] = (), taken_ranges: Sequence[range] = ()
) -> tuple[list[int], range]:
    """``count`` distinct free ports and a worker-port range that holds none of them.

    The kernel hands out free ports from the same span as the range, so a port drawn
    independently lands inside the range now and then, and ``ray start`` refuses it
    ("used by other components"); each port is drawn again until it lies outside. A node
    joining a cluster passes the other nodes' component ports (``taken_ports``) and worker
    ranges (``taken_ranges``): its range then overlaps none of them and holds none of their
    ports, and none of its ports lies in their ranges (a worker of another node could take
    it before this node starts).
    """

    def clashes(workers: range) -> bool:
        return (
            workers.stop - 1 > 65535
            or any(port in workers for port in taken_ports)
            or any(r.start < workers.stop and workers.start < r.stop for r in taken_ranges)
        )

    low = free_port()
    while clashes(range(low, low + _WORKER_PORTS + 1)):
        low = free_port()
    workers = range(low, low + _WORKER_PORTS + 1)
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if (
            port not in workers
            and port not in ports
            and port not in taken_ports
            and not any(port in r for r in taken_ranges)
        ):
            ports.append(port)
    return ports, workers


def _ancestors() -> set[int]:
    """This process and the processes above it (never killed by :meth:`StandingCluster.stop`)."""
    found: set[int] = set()
    pid: int | None = os.getpid()
    while pid is not None and pid > 1 and pid not in found:
        found.add(pid)
        pid = _parent(pid)
    return found


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def processes_where(marks: Iterable[str], gcs_port: int | None = None) -> set[int]:
    """The processes whose command line contains one of ``marks`` (or, with ``gcs_port``,
    names a GCS at that port: ``--address=HOST:PORT``, ``--gcs-address=HOST:PORT``), and
    every process below them: a raylet's workers show only their title (``ray::IDLE``) and
    are found as its children. This process and those above it are never included."""
    marks = tuple(marks)
    own = _ancestors()
    children: dict[int, list[int]] = {}
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in own:
            continue
        pid = int(entry.name)
        parent = _parent(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
        args = _cmdline(pid)
        if args is None:
            continue
        text = " ".join(args)
        if any(mark in text for mark in marks) or (
            gcs_port is not None and any(_names_gcs(arg, gcs_port) for arg in args)
        ):
            found.add(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child not in own:
                found.add(child)
                todo.append(child)
    return found


def _names_gcs(arg: str, port: int) -> bool:
    flags = ("--address=", "--gcs-address=", "--gcs_address=")
    return arg.startswith(flags) and arg.endswith(f":{port}")


def kill_processes(pids: Iterable[int]) -> None:
    """SIGKILL ``pids`` all at once: every one is stopped (SIGSTOP) first, so none of them
    reports another's death before it dies itself, as when a machine goes away."""
    pids = sorted(pids)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


#: the ``ray start`` flags of one node's component ports (a head adds ``--port``; no Ray
#: client server is started: it needs ``ray[client]``, which the workspace does not install)
NODE_PORT_FLAGS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)


def node_ports(ports: Sequence[int], workers: range) -> list[str]:
    """The ``ray start`` flags of one node: ``ports`` (one for each of
    :data:`NODE_PORT_FLAGS`, in that order) and the worker-port range ``workers``."""
    return [
        *(f"{flag}={port}" for flag, port in zip(NODE_PORT_FLAGS, ports, strict=True)),
        f"--min-worker-port={workers.start}",
        f"--max-worker-port={workers.stop - 1}",
    ]


#: how many times a node is started before its start counts as failed: `ray start` gives
#: a raylet 30 s (not configurable) to register, which a machine busy with other work can
#: take longer than
START_TRIES = 3


def start_with_retries(
    start: Callable[[], str | None], stop: Callable[[], None], what: str
) -> None:
    """Run ``start`` (one ``ray start`` on new ports: what went wrong, or ``None``) up to
    :data:`START_TRIES` times, ``stop`` after each failure; raise after the last."""
    for attempt in range(1, START_TRIES + 1):
        failure = start()
        if failure is None:
            return
        stop()
        if attempt == START_TRIES:
            raise RuntimeError(f"{what} failed {START_TRIES} times; the last: {failure}")


def run_ray_start(args: list[str], env: Mapping[str, str]) -> str | None:
    """Run one ``ray start``; ``None`` when it started, else what it said."""
    try:
        done = subprocess.run(args, env=dict(env), capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return "ray start did not return within 180 s"
    if done.returncode:
        return f"exit status {done.returncode}: {done.stderr[-2000:]}"
    return None


class StandingCluster:
    """``ray start --head`` in ``temp_dir`` on free ports; :meth:`stop` kills its processes.

    ``resources`` adds custom resources to the head (``{"node_a": 8}``: a name that only
    the head has, to tell the nodes apart or pin work to it)."""

    def __init__(
        self, temp_dir: Path, num_cpus: int = 8, resources: Mapping[str, float] | None = None
    ) -> None:
        # Ray's socket paths must stay short (AF_UNIX): a short folder beside the temp dir
        self.temp_dir = temp_dir
        start_with_retries(lambda: self._start(num_cpus, resources), self.stop, "ray start")

    def _start(self, num_cpus: int, resources: Mapping[str, float] | None) -> str | None:
        """One ``ray start --head`` on newly drawn ports; what went wrong, or ``None``."""
        # the GCS, then the node's components
        ports, self.worker_ports = cluster_ports(1 + len(NODE_PORT_FLAGS))
        self.port, *components = ports
        #: every component port of the head, which a node joining it must not use
        self.ports: tuple[int, ...] = tuple(ports)
        self.address = f"127.0.0.1:{self.port}"
        args = [
            _ray_bin(),
            "start",
            "--head",
            f"--temp-dir={self.temp_dir}",
            f"--num-cpus={num_cpus}",
            *([f"--resources={json.dumps(dict(resources))}"] if resources else []),
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--port={self.port}",
            *node_ports(components, self.worker_ports),
        ]
        env = self.env()
        del env["RAY_ADDRESS"]  # `ray start --head` must not look for a cluster to join
        return run_ray_start(args, env)

    def env(self) -> dict[str, str]:
        """The environment of a driver process on this cluster."""
        env = dict(os.environ)
        env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
        env["RAY_ADDRESS"] = self.address
        # Ray's own default authentication, as an operator's `ray start --head` has it (token,
        # since Ray 2.59): the driver must find its way in by itself
        env.pop("RAY_AUTH_MODE", None)
        env.pop("RAY_NAMESPACE", None)
        return env

    def stop(self) -> None:
        """Kill every process whose command line names this cluster's temp dir or GCS
        address (any host, this port: a node joined to it), and the
        processes below them (the raylets' workers)."""
        kill_processes(processes_where([str(self.temp_dir), self.address], gcs_port=self.port))


@dataclass
class Driver:
    """A finished driver process: its exit status and output."""

    returncode: int
    stdout: str
    stderr: str


def _command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "sc_trainer.cli", "--no-progress", *args]


def run_driver(cluster: StandingCluster, args: list[str], timeout: float = 300) -> Driver:
    """Run ``sc-demo args`` as a driver process on ``cluster`` to its end."""
    done = subprocess.run(
        _command(args), env=cluster.env(), capture_output=True, text=True, timeout=timeout
    )
    return Driver(done.returncode, done.stdout, done.stderr)


def start_driver(cluster: StandingCluster, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``sc-demo args`` as a driver process on ``cluster`` (its output in ``log``)."""
    with log.open("wb") as out:
        return subprocess.Popen(_command(args), env=cluster.env(), stdout=out, stderr=out)


def wait_for(path: Path, timeout: float) -> None:
    """Wait until ``path`` exists."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.2)
