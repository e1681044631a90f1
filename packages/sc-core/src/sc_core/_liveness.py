"""Liveness: which ranks of a group are dead or busy, and the optional monitor thread.

A rank is *dead* once a call found it dead (the backend raised
:class:`~sc_core.WorkerDiedError`) or the aliveness check did; later calls touching it raise at
once. A rank is *busy* while it still runs a call the group gave up on (see ``_busy.py``).
One :class:`Liveness` is shared by a group and the groups spawned from it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Protocol

from ._busy import BusyRanks
from ._call import Call
from ._errors import WorkerDiedError

__all__ = ["Liveness"]

logger = logging.getLogger("sc_core.worker_group")


class _Watched(Protocol):
    """What the monitor thread uses of a worker group."""

    name_prefix: str

    @property
    def world_size(self) -> int: ...

    @property
    def dead_ranks(self) -> list[int]: ...

    def check_worker_aliveness(self) -> list[int]: ...


class Liveness:
    """Dead and busy ranks of one set of workers, and the thread that watches them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.dead: dict[int, str] = {}
        self.busy = BusyRanks()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def mark_dead(self, ranks: Iterable[int], reason: str = "") -> None:
        """Record dead ranks (the first reason given for a rank is kept)."""
        with self.lock:
            for rank in ranks:
                self.dead.setdefault(rank, reason)

    def revive(self, ranks: Iterable[int]) -> None:
        """Forget that ``ranks`` died or are busy: new workers took their places."""
        with self.lock:
            for rank in ranks:
                self.dead.pop(rank, None)
        self.busy.forget(ranks)

    def dead_ranks(self) -> list[int]:
        with self.lock:
            return sorted(self.dead)

    def check_alive(self, call: Call) -> None:
        """Raise :class:`~sc_core.WorkerDiedError` if ``call`` touches a dead rank."""
        if not self.dead:
            return
        with self.lock:
            dead = {r: self.dead[r] for r in call.ranks if r in self.dead}
        if dead:
            reasons = sorted(set(dead.values()) - {""})
            raise WorkerDiedError(call.method_name, list(dead), "; ".join(reasons))

    def find_dead(self, world_size: int, is_alive: Callable[[int], bool]) -> list[int]:
        """Ask ``is_alive`` about every rank not yet known dead; record and return the ranks
        found dead now."""
        known = set(self.dead_ranks())
        newly = [r for r in range(world_size) if r not in known and not is_alive(r)]
        if newly:
            self.mark_dead(newly, "found by the aliveness check")
        return newly

    @staticmethod
    def wait_all_alive(world_size: int, is_alive: Callable[[int], bool], timeout: float) -> None:
        """Return once every rank is alive; :class:`WorkerDiedError` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            down = [r for r in range(world_size) if not is_alive(r)]
            if not down:
                return
            if time.monotonic() >= deadline:
                raise WorkerDiedError(None, down, f"not alive {timeout}s after start")
            time.sleep(min(0.05, timeout))

    @property
    def monitoring(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start_monitor(self, group: _Watched, interval: float, abort: bool) -> None:
        """Check ``group``'s workers every ``interval`` seconds on a daemon thread, which
        holds the group only weakly and ends with it (or when every rank is dead)."""
        if self.monitoring:
            return
        self._stop.clear()
        group_ref = weakref.ref(group)
        stop = self._stop

        def loop() -> None:
            while not stop.wait(interval):
                current = group_ref()
                if current is None:
                    return
                newly = current.check_worker_aliveness()
                if newly:
                    logger.error(
                        "worker group %s: ranks %s are no longer alive", current.name_prefix, newly
                    )
                    if abort:
                        signal.raise_signal(signal.SIGABRT)
                if len(current.dead_ranks) == current.world_size:
                    return
                del current

        self._thread = threading.Thread(
            target=loop, name=f"sc-aliveness-{group.name_prefix}", daemon=True
        )
        self._thread.start()

    def stop_monitor(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._thread = None
