"""A second Ray node on this machine, joined to a :class:`StandingCluster`, that a test can
lose (not public API).

:class:`ClusterNode` runs ``ray start --address=<head>`` with a temp dir, ports and custom
resources of its own: a second raylet beside the head's, which Ray counts as a node of its
own (its resources, its placement-group bundles, its worker processes). :meth:`ClusterNode.kill`
loses it the way a machine is lost: every one of its processes (the raylet, its agents, its
log monitor and every worker process the raylet started) is stopped and then SIGKILLed, with
no clean-up; the head learns of it through its health checks, as of a node gone away.

Its processes are found by its temp dir (the raylet's and the log monitor's command lines
name it) and, below the raylet, as its children: a worker process shows only its title
(``ray::WorkerDict``), never the node it belongs to.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from sc_trainer.launch._connect import auth_token_source

from ._standing_cluster import (
    NODE_PORT_FLAGS,
    StandingCluster,
    _ray_bin,
    cluster_ports,
    kill_processes,
    node_ports,
    processes_where,
    run_ray_start,
    start_with_retries,
)

__all__ = ["ClusterNode"]


def _join_env(head: StandingCluster) -> dict[str, str]:
    """The environment of ``ray start --address``: the head's, with Ray's token
    authentication on when this account has a token (then the head, started from the same
    account, requires it; a raylet without it is refused)."""
    env = head.env()
    del env["RAY_ADDRESS"]
    if auth_token_source() is not None:
        env["RAY_AUTH_MODE"] = "token"
    return env


class ClusterNode:
    """``ray start --address=<head>`` in ``temp_dir`` with ``num_cpus`` CPUs and
    ``resources`` (``{"node_b": 8}``: a name only this node has); :meth:`kill` loses it."""

    def __init__(
        self,
        head: StandingCluster,
        temp_dir: Path,
        num_cpus: int,
        resources: Mapping[str, float] | None = None,
    ) -> None:
        self.head = head
        self.temp_dir = temp_dir
        #: when :meth:`kill` killed the node (``time.monotonic()``), and the pids it killed
        self.killed_at: float | None = None
        self.killed: set[int] = set()
        start_with_retries(
            lambda: self._start(num_cpus, resources), self.stop, "ray start --address"
        )

    def _start(self, num_cpus: int, resources: Mapping[str, float] | None) -> str | None:
        """One ``ray start --address`` on newly drawn ports; what went wrong, or ``None``."""
        head = self.head
        # no port of the head, none in its worker range, and a worker range of its own
        # that holds none of either node's ports: `ray start` refuses a component port
        # inside its worker range, and a worker of the head could take a port in the
        # head's range before this node binds it
        ports, self.worker_ports = cluster_ports(
            len(NODE_PORT_FLAGS), taken_ports=head.ports, taken_ranges=[head.worker_ports]
        )
        #: every component port of this node
        self.ports: tuple[int, ...] = tuple(ports)
        args = [
            _ray_bin(),
            "start",
            f"--address={head.address}",
            f"--temp-dir={self.temp_dir}",
            f"--num-cpus={num_cpus}",
            *([f"--resources={json.dumps(dict(resources))}"] if resources else []),
            "--disable-usage-stats",
            *node_ports(ports, self.worker_ports),
        ]
        return run_ray_start(args, _join_env(head))

    def processes(self) -> set[int]:
        """The node's processes now: those naming its temp dir, and every process below them
        (the raylet's agents and workers)."""
        return processes_where([str(self.temp_dir)])

    def raylet_pid(self) -> int | None:
        """The pid of the node's raylet (``None`` once it is gone: a zombie counts as gone)."""
        for pid in self.processes():
            if not _alive(pid):
                continue
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if args and args[0].endswith(b"/raylet"):
                return pid
        return None

    def kill(self) -> set[int]:
        """Lose the node: stop every one of its processes, then SIGKILL them all (the
        raylet, its agents, its log monitor, its worker processes); returns their pids."""
        pids = self.processes()
        kill_processes(pids)
        self.killed_at = time.monotonic()
        self.killed |= pids
        # SIGKILL is delivered at once, but a process is gone only once the kernel has torn
        # it down (a loaded machine takes a moment): wait for that, bounded
        deadline = time.monotonic() + 10.0
        while not self.is_gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        return pids

    def stop(self) -> None:
        """Kill whatever is left of the node (nothing, after :meth:`kill`)."""
        kill_processes(self.processes())

    def is_gone(self) -> bool:
        """Whether none of the processes :meth:`kill` killed is left (zombies aside)."""
        return not any(_alive(pid) for pid in self.killed)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
