"""The health and restart state machine of a :class:`~sc_rollout.routing.Router`'s servers.

A :class:`RouterState` is what the router and its :class:`ServerHealth` share: the condition
variable that guards everything, the servers held, the current weights and the closed flag.
:class:`ServerHealth` checks servers and takes the dead ones out, restarts them through the
owner's restart hook and brings them up (healthy, then given the current weights, then
live), each step threaded by the entry's incarnation counter: a step whose incarnation is no
longer the entry's was superseded (the server was removed, found dead again, or the router
closed) and does nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from .._errors import (
    RolloutTimeoutError,
    RolloutTypeError,
    RouterClosedError,
    ScRolloutError,
    ServerUnavailableError,
)
from ..engines._types import EngineHealth, WeightUpdate
from ..serving._client import RolloutClient
from ._servers import RestartHook, ServerEntry, ServerState, broadcast

__all__ = ["RouterState", "ServerHealth"]

_log = logging.getLogger("sc_rollout.router")


@dataclasses.dataclass(eq=False)
class RouterState:
    """What a router and its :class:`ServerHealth` share; read and written under ``cond``."""

    cond: threading.Condition = dataclasses.field(default_factory=threading.Condition)
    servers: dict[str, ServerEntry] = dataclasses.field(default_factory=dict)
    update: WeightUpdate | None = None
    closed: bool = False

    def drop(self, entry: ServerEntry) -> None:
        """Forget ``entry`` (under the lock); a sync of it in progress stops."""
        if self.servers.get(entry.name) is not entry:
            return
        del self.servers[entry.name]
        entry.incarnation += 1
        _log.info("server %s removed", entry.name)

    def states(self) -> str:
        return ", ".join(f"{n}: {e.state.value}" for n, e in self.servers.items()) or "none"

    def targets(self) -> list[tuple[ServerEntry, RolloutClient, int]]:
        """The servers a broadcast goes to (under the lock): live and draining ones."""
        return [
            (e, e.client, e.incarnation)
            for e in self.servers.values()
            if e.state in (ServerState.LIVE, ServerState.DRAINING)
        ]


class ServerHealth:
    """Checks, takes out, restarts and brings up the servers of a :class:`RouterState`.

    ``restart``: the hook that brings a dead server back (``None``: a dead server stays
    out); the timeouts are the router's. Its threads (one per restart or re-sync, and the
    periodic checker) are joined by :meth:`threads` at close.
    """

    def __init__(
        self,
        state: RouterState,
        *,
        restart: RestartHook | None,
        request_timeout: float,
        health_timeout: float,
        start_timeout: float,
    ) -> None:
        self._state = state
        self._cond = state.cond
        self._restart = restart
        self._request_timeout = request_timeout
        self._health_timeout = health_timeout
        self._start_timeout = start_timeout
        self._workers: set[threading.Thread] = set()
        self._monitor: threading.Thread | None = None

    def client(self, url: str) -> RolloutClient:
        return RolloutClient(
            url, timeout_s=self._request_timeout, health_timeout_s=self._health_timeout
        )

    def threads(self) -> list[threading.Thread]:
        """The threads to join at close (under the lock)."""
        return [*self._workers, *([self._monitor] if self._monitor else [])]

    def check(self) -> None:
        """Check every live and draining server now (see ``Router.check_health``)."""
        with self._cond:
            targets = self._state.targets()
        outcomes = broadcast([c for _, c, _ in targets], lambda client: client.health())
        for (entry, _client, incarnation), outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self.mark_dead(entry, incarnation, f"health check failed: {outcome}")
                continue
            with self._cond:
                if entry.incarnation != incarnation:
                    continue
                entry.weight_version = outcome.weight_version
                current = self._state.update
                if (
                    entry.state is ServerState.LIVE
                    and current is not None
                    and outcome.weight_version != current.version
                ):
                    _log.warning(
                        "server %s holds weights version %d, not %d: re-syncing it",
                        entry.name,
                        outcome.weight_version,
                        current.version,
                    )
                    entry.state = ServerState.SYNCING
                    self._spawn(self._resync, entry, incarnation)

    def suspect(
        self, entry: ServerEntry, client: RolloutClient, incarnation: int, reason: str
    ) -> None:
        """A call to ``entry`` failed: check its health, and take it out if that fails too."""
        try:
            client.health()
        except ScRolloutError as exc:
            self.mark_dead(entry, incarnation, f"{reason}; then its health check: {exc}")

    def mark_dead(self, entry: ServerEntry, incarnation: int, reason: str) -> None:
        """Take ``entry`` out (once per incarnation): cut its calls in flight, and restart it
        if there is a restart hook (a draining server is just forgotten)."""
        with self._cond:
            if entry.incarnation != incarnation or self._state.servers.get(entry.name) is not entry:
                return
            client = entry.client
            entry.error = reason
            if entry.state is ServerState.DRAINING:
                self._state.drop(entry)
            else:
                entry.incarnation += 1
                if self._restart is not None and not self._state.closed:
                    entry.state = ServerState.RESTARTING
                    self._spawn(self._recover, entry, entry.incarnation)
                else:
                    entry.state = ServerState.DEAD
            self._cond.notify_all()
        _log.warning("server %s (%s) is out: %s", entry.name, entry.url, reason)
        client.close_connections()

    def _recover(self, entry: ServerEntry, incarnation: int) -> None:
        """Restart ``entry`` through the hook, then bring it up (a restarting thread)."""
        hook = self._restart
        if hook is None:
            return
        try:
            url = hook(entry.name)
            if not isinstance(url, str):
                raise RolloutTypeError(
                    f"the restart hook returned {url!r} for server {entry.name!r}; it must "
                    "return the URL of the restarted server"
                )
            client = self.client(url)
            with self._cond:
                if entry.incarnation != incarnation:
                    return
                entry.url = url
                entry.client = client
                entry.restarts += 1
                entry.state = ServerState.SYNCING
            if self.bring_up(entry, incarnation):
                _log.info("server %s restarted at %s", entry.name, url)
        except Exception as exc:
            self._fail(entry, incarnation, f"restart failed: {type(exc).__name__}: {exc}")

    def _resync(self, entry: ServerEntry, incarnation: int) -> None:
        """Bring a live server that holds the wrong weights up again (a syncing thread)."""
        try:
            self.bring_up(entry, incarnation)
        except Exception as exc:
            self._fail(entry, incarnation, f"re-sync failed: {type(exc).__name__}: {exc}")

    def _fail(self, entry: ServerEntry, incarnation: int, reason: str) -> None:
        _log.error("server %s stays out: %s", entry.name, reason)
        with self._cond:
            if entry.incarnation == incarnation and self._state.servers.get(entry.name) is entry:
                entry.state = ServerState.DEAD
                entry.error = reason
                self._cond.notify_all()

    def bring_up(self, entry: ServerEntry, incarnation: int) -> bool:
        """Wait until ``entry`` is healthy, give it the current weights until it holds the
        version that is current when it is done, and make it live. ``False`` if the entry
        was superseded meanwhile (removed, found dead again, the router closed)."""
        client = entry.client
        health = self._wait_healthy(entry, client)
        version = health.weight_version
        pushed: WeightUpdate | None = None
        while True:
            with self._cond:
                if (
                    self._state.closed
                    or entry.incarnation != incarnation
                    or self._state.servers.get(entry.name) is not entry
                ):
                    return False
                if self._state.update is pushed:
                    entry.weight_version = version
                    entry.state = ServerState.LIVE
                    self._cond.notify_all()
                    return True
                pushed = self._state.update
            if pushed is not None:
                version = client.load_weights(pushed)

    def _wait_healthy(self, entry: ServerEntry, client: RolloutClient) -> EngineHealth:
        deadline = time.monotonic() + self._start_timeout
        pause = 0.02
        while True:
            try:
                return client.health()
            except (ServerUnavailableError, RolloutTimeoutError) as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RolloutTimeoutError(
                        f"server {entry.name!r} at {client.url} was not healthy within "
                        f"{self._start_timeout:g} s: {exc}"
                    ) from None
                with self._cond:
                    if self._cond.wait_for(lambda: self._state.closed, min(pause, left)):
                        raise RouterClosedError(
                            f"Router closed while {entry.name!r} started"
                        ) from None
                pause = min(pause * 2, 0.5)

    def _spawn(
        self, target: Callable[[ServerEntry, int], None], entry: ServerEntry, incarnation: int
    ) -> None:
        """Run ``target(entry, incarnation)`` on a thread the router joins at close."""

        def run() -> None:
            try:
                target(entry, incarnation)
            finally:
                with self._cond:
                    self._workers.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=f"sc-rollout-{entry.name}", daemon=True)
        self._workers.add(thread)
        thread.start()

    def watch(self, interval: float, check: Callable[[], object]) -> None:
        """Call ``check`` every ``interval`` seconds from a thread, until the router closes."""
        self._monitor = threading.Thread(
            target=self._watch, args=(interval, check), name="sc-rollout-health", daemon=True
        )
        self._monitor.start()

    def _watch(self, interval: float, check: Callable[[], object]) -> None:
        while True:
            with self._cond:
                if self._cond.wait_for(lambda: self._state.closed, interval):
                    return
            try:
                check()
            except Exception:
                _log.exception("the periodic health check failed")
