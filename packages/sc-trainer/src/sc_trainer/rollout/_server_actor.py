"""The body of a rollout server's Ray actor: :class:`RolloutServerActor` owns one server
process on its node.

This module imports only the standard library and sc-rollout (Ray on first use, in the
actor): the fleet ships it to the actor by value (see ``_fleet_ray``), so that the actor's
process starts a server without importing sc_trainer (torch, the trainer). Its errors
are sc-rollout's :class:`~sc_rollout.errors.RolloutServerError`; the fleet turns them into a
:class:`~sc_trainer.rollout.RolloutFleetError` on the driver.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sc_core.backend import free_port
from sc_rollout import ServerProcess
from sc_rollout.errors import RolloutServerError

__all__ = ["ArgvFactory", "RolloutServerActor"]

logger = logging.getLogger(__name__)

#: the command line of one server process, given the address to bind and a free port there;
#: the process prints the ready line of ``python -m sc_rollout`` (see ``sc_rollout.serving.serve``)
ArgvFactory = Callable[[str, int], Sequence[str]]


def _node_ip_address() -> str:
    """The address of the node this actor runs on (``ray.util.get_node_ip_address()``)."""
    import ray

    util: Any = ray.util  # Ray is loosely typed
    return str(util.get_node_ip_address())


class RolloutServerActor:
    """The body of one server's Ray actor: owns the server process of server ``index``.

    Each method runs in the actor (on the server's node). :meth:`start` starts the process
    (if it does not run) and returns its URL; :meth:`restart` kills it and starts it again
    (a new URL: a new port); :meth:`kill` is a crash (SIGKILL); :meth:`stop` a shutdown.
    """

    def __init__(
        self,
        index: int,
        argv_factory: ArgvFactory,
        env: Mapping[str, str],
        start_timeout_s: float,
    ) -> None:
        self._index = index
        self._factory = argv_factory
        self._env = dict(env)
        self._start_timeout = start_timeout_s
        self._proc: ServerProcess | None = None
        self._lock = threading.Lock()

    def start(self) -> str:
        with self._lock:
            if self._proc is not None and self._proc.alive():
                return self._proc.url
            host = _node_ip_address()
            try:
                argv = [str(a) for a in self._factory(host, free_port(host))]
            except Exception as exc:
                raise RolloutServerError(
                    f"rollout server {self._index}: the argv factory failed for host {host!r}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            try:
                self._proc = ServerProcess(
                    argv, env={**os.environ, **self._env}, start_timeout_s=self._start_timeout
                )
            except Exception as exc:
                raise RolloutServerError(
                    f"rollout server {self._index} did not start on {host} with argv {argv}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            logger.info("rollout server %d started at %s", self._index, self._proc.url)
            return self._proc.url

    def restart(self) -> str:
        self.kill()
        return self.start()

    def kill(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._proc.kill()

    def stop(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop()

    def pid(self) -> int | None:
        with self._lock:
            return None if self._proc is None or not self._proc.alive() else self._proc.pid
