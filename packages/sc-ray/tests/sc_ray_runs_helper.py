"""The worker class and the driver script of ``test_ray_runs.py``.

The standing cluster's workers import this module (it is on their ``PYTHONPATH``); each
driver runs ``python -m sc_ray_runs_helper ADDRESS RUN_ID MODE LR ABANDON_S``, prints one
JSON line (what it built, or the error it got), then answers commands read from stdin
(``bump``, ``pids``, ``release``) until it is killed; ``torn FOLDER`` runs ``bump`` with a
call id (scope 1), then kills itself (SIGKILL) while it hands ``meet(FOLDER)`` out, once rank
0 runs it and before rank 1 gets it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sc_core import Worker
from sc_dispatch import Dispatch, register


@dataclass
class Optim:
    lr: float = 0.001


class Tiny(Worker):
    """A worker that counts its calls (state a re-initialised worker would lose)."""

    def __init__(self, optim: Optim) -> None:
        super().__init__()
        self.optim = optim
        self.calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def bump(self) -> int:
        self.calls += 1
        return self.calls

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def meet(self, folder: str) -> list[int]:
        """A collective: this rank arrives (a file in ``folder``) and waits until every rank
        has; the ranks that arrived, by the time all did."""
        self.calls += 1
        Path(folder, f"rank{self.rank}").touch()
        arrived = threading.Event()
        while not arrived.wait(0.01):  # the others come from other processes: look again
            ranks = sorted(int(p.name[4:]) for p in Path(folder).glob("rank*"))
            if len(ranks) == self.world_size:
                return ranks
        return []  # pragma: no cover - the loop only ends by returning


def pid_of(_instance: object) -> int:
    """The pid of the actor process it runs in (through ``rapi.call_in_actor``)."""
    return os.getpid()


class Owner:
    """An actor beside a run's groups that owns something to end (a server process, say):
    its stop method writes ``marker`` (a run records it with ``record_actors``)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def stop(self) -> None:
        with open(self.marker, "w", encoding="utf-8") as fh:
            fh.write(str(os.getpid()))


def _say(value: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    import ray  # the driver only: the workers import this module without starting Ray
    from sc_core import CallIds
    from sc_core.ext import arm_torn_dispatch
    from sc_ray import RayClassWithInitArgs, RayRun, run_namespace

    # this file runs as __main__: use the module's own classes, which the workers import
    from sc_ray_runs_helper import Optim, Tiny

    address, run_id, mode, lr, abandon_s = argv
    ray.init(
        address=address,
        namespace=run_namespace(run_id),
        log_to_driver=False,
        configure_logging=False,
    )
    run = None
    try:
        if mode == "create":
            run = RayRun.create(
                run_id, abandon_after_s=float(abandon_s), lease_s=30.0, heartbeat_s=0.2
            )
        else:
            run = RayRun.attach(run_id)
        pool = run.resource_pool("pool", [2])
        cia = RayClassWithInitArgs(Tiny, optim=Optim(float(lr)))
        group = run.worker_group("g", pool, cia)
    except Exception as exc:
        if run is not None:
            run.release()
        _say({"error": type(exc).__name__, "message": str(exc)})
        return 0
    _say({"epoch": run.epoch, "attached": run.attached, "pids": group.pid()})
    for line in sys.stdin:
        command = line.strip()
        if command == "bump":
            _say({"bump": group.bump()})
        elif command == "pids":
            _say({"pids": group.pid()})
        elif command == "release":
            run.release()
            _say({"released": True})
        elif command.startswith("torn "):
            ids = CallIds(epoch=run.epoch)
            ids.begin(1)
            group.use_call_ids(ids)
            group.bump()
            arm_torn_dispatch(lambda: os.kill(os.getpid(), signal.SIGKILL))
            group.meet(command.split(" ", 1)[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
