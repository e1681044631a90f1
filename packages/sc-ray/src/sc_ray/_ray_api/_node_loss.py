"""Losing a node on purpose (fault-injection tests): an actor on the node kills its raylet.

A Ray node is its raylet and the processes below it: the dashboard and runtime-env agents
and every worker process (the raylet starts them all). :class:`NodeKiller` is a tiny actor
(no resources reserved) pinned to one node; :meth:`NodeKiller.lose` stops every process
below the raylet and the raylet itself (SIGSTOP, so that none of them reports another's
death first), SIGKILLs them all, then itself: the node goes away as when its machine does,
with no clean-up, and the cluster learns of it through its health checks. Linux only (it
reads ``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any, cast

from ._base import ActorHandle, NodeAffinitySchedulingStrategy, ObjectRef, ray

__all__ = ["NodeKiller", "fire_node_killer", "start_node_killer"]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _below(root: int) -> set[int]:
    """Every process below ``root`` (children, their children...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = _parent(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class NodeKiller:
    """The actor that loses its own node (see the module)."""

    def raylet(self) -> int:
        """The pid of this node's raylet: this worker process's parent. Raises
        ``RuntimeError`` when the parent is not a raylet (a worker started some other way)."""
        pid = os.getppid()
        try:
            exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError as exc:
            raise RuntimeError(f"cannot read the parent process {pid}: {exc}") from exc
        if not exe.endswith("raylet"):
            raise RuntimeError(
                f"the parent of this worker process (pid {os.getpid()}) is {exe!r} (pid {pid}), "
                "not a raylet: cannot tell which processes are the node's"
            )
        return pid

    def lose(self) -> None:
        """Stop, then SIGKILL, the raylet and every process below it; this one last."""
        raylet = self.raylet()
        me = os.getpid()
        pids = sorted((_below(raylet) | {raylet}) - {me})
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        os.kill(me, signal.SIGKILL)


_remote_killer: Any = None


def start_node_killer(node_id: str) -> tuple[ActorHandle, ObjectRef]:
    """A :class:`NodeKiller` on node ``node_id`` (no resources, pinned there), and a
    reference that resolves to its node's raylet pid once it runs there."""
    global _remote_killer
    if _remote_killer is None:
        _remote_killer = ray.remote(num_cpus=0, max_restarts=0)(NodeKiller)
    actor = _remote_killer.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    ).remote()
    return cast("ActorHandle", actor), cast("ObjectRef", actor.raylet.remote())


def fire_node_killer(actor: ActorHandle) -> ObjectRef:
    """Ask the killer to lose its node; the reference fails once its process is gone."""
    return cast("ObjectRef", cast(Any, actor).lose.remote())
