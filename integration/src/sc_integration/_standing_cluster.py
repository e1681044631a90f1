"""A standing local Ray cluster, for the re-attach tests and benchmark (not public API).

:class:`StandingCluster` runs ``ray start --head`` with a temp dir and ports of its own
(nothing shared with another cluster on the machine) and stops every process it started
by that temp dir; :func:`run_driver` runs ``sc-demo`` as a separate driver process on it,
so a test can SIGKILL a driver and start another.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Driver",
    "StandingCluster",
    "cluster_ports",
    "free_port",
    "run_driver",
    "start_driver",
    "wait_for",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_WORKER_PORTS = 200


def cluster_ports(count: int) -> tuple[list[int], range]:
    """``count`` distinct free ports and a worker-port range that holds none of them.

    The kernel hands out free ports from the same span as the range, so a port drawn
    independently lands inside the range now and then, and ``ray start`` refuses it
    ("used by other components"); each port is drawn again until it lies outside.
    """
    low = free_port()
    while low + _WORKER_PORTS > 65535:
        low = free_port()
    workers = range(low, low + _WORKER_PORTS + 1)
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in workers and port not in ports:
            ports.append(port)
    return ports, workers


def _ancestors() -> set[int]:
    """This process and the processes above it (never killed by :meth:`StandingCluster.stop`)."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


class StandingCluster:
    """``ray start --head`` in ``temp_dir`` on free ports; :meth:`stop` kills its processes."""

    def __init__(self, temp_dir: Path, num_cpus: int = 8) -> None:
        # Ray's socket paths must stay short (AF_UNIX): a short folder beside the temp dir
        self.temp_dir = temp_dir
        (self.port, *components), workers = cluster_ports(7)
        self.address = f"127.0.0.1:{self.port}"
        flags = (
            "--node-manager-port",
            "--object-manager-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        )
        ports = {"--port": self.port, **dict(zip(flags, components, strict=True))}
        args = [
            _ray_bin(),
            "start",
            "--head",
            f"--temp-dir={temp_dir}",
            f"--num-cpus={num_cpus}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--min-worker-port={workers.start}",
            f"--max-worker-port={workers.stop - 1}",
            *(f"{flag}={port}" for flag, port in ports.items()),
        ]
        env = self.env()
        del env["RAY_ADDRESS"]  # `ray start --head` must not look for a cluster to join
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
        if done.returncode:
            self.stop()
            raise RuntimeError(f"ray start failed ({done.returncode}): {done.stderr[-2000:]}")

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
        """Kill every process whose command line names this cluster's temp dir or port."""
        marks = (str(self.temp_dir), f"--gcs-address=127.0.0.1:{self.port}", self.address)
        own = _ancestors()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in own:
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if any(mark in cmdline for mark in marks):
                with contextlib.suppress(OSError):
                    os.kill(int(entry.name), signal.SIGKILL)


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
