"""``Router``: generation requests spread over rollout servers, on the caller's side.

A request of a session goes where the session went before (a bounded LRU map); any other
request to the live server with the fewest requests in flight. Servers are added (checked
healthy and given the current weights first) and removed (drained: no new requests, those
in flight finish) at any time. A server that fails a request (refused, reset) and then its
health check, or that fails a periodic health check, is out: its requests in flight are cut
and sent again to a live server, so every request is answered once; the owner's restart hook
brings it back, and it takes requests again only once it holds the current weight version.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from .._errors import (
    DuplicateServerError,
    NoLiveServerError,
    RolloutConfigError,
    RolloutRequestError,
    RolloutServerError,
    RolloutTimeoutError,
    RolloutTypeError,
    RouterClosedError,
    ScRolloutError,
    ServerUnavailableError,
    UnknownServerError,
    WeightVersionError,
)
from .._settings import HEALTH_TIMEOUT, REQUEST_TIMEOUT, START_TIMEOUT
from ..engines._types import EngineHealth, GenerateRequest, GenerateResult, WeightUpdate, check_int
from ..serving._client import RolloutClient, check_timeout
from ._affinity import AffinityMap, least_loaded
from ._servers import (
    WAITING,
    RestartHook,
    ServerEntry,
    ServerState,
    ServerStatus,
    broadcast,
)

__all__ = ["RestartHook", "Router", "ServerState", "ServerStatus"]

_log = logging.getLogger("sc_rollout.router")
_T = TypeVar("_T")


class Router:
    """Routes generation requests over rollout servers (see the module's documentation).

    ``urls``: servers to add at once (each named by its URL). ``restart``: the
    :data:`RestartHook` that brings a dead server back (without one a dead server stays
    out). ``session_capacity``: sessions remembered. ``max_attempts``: servers one request
    may be sent to before :class:`NoLiveServerError`. ``request_timeout_s`` /
    ``health_timeout_s``: the deadlines of a request and of a health check (defaults
    ``SC_ROLLOUT_REQUEST_TIMEOUT_S``, ``SC_ROLLOUT_HEALTH_TIMEOUT_S``).
    ``start_timeout_s``: how long an added or restarted server may take to be healthy, and a
    request may wait for a live server (default ``SC_ROLLOUT_START_TIMEOUT_S``).
    ``health_interval_s``: check every server this often from a thread (``None``: only
    when :meth:`check_health` is called, and when a request fails).

    Thread-safe: :meth:`generate` is meant to be called from many threads at once.
    """

    def __init__(
        self,
        urls: Iterable[str] = (),
        *,
        restart: RestartHook | None = None,
        session_capacity: int = 10_000,
        max_attempts: int = 4,
        request_timeout_s: float | None = None,
        health_timeout_s: float | None = None,
        start_timeout_s: float | None = None,
        health_interval_s: float | None = None,
    ) -> None:
        if restart is not None and not callable(restart):
            raise RolloutTypeError(f"Router(restart=...) must be callable, got {restart!r}")
        self._restart = restart
        self._affinity = AffinityMap(session_capacity)
        self._max_attempts = check_int(max_attempts, "Router max_attempts", 1, RolloutConfigError)
        self._request_timeout = check_timeout(
            request_timeout_s, REQUEST_TIMEOUT.get(), "Router request_timeout_s"
        )
        self._health_timeout = check_timeout(
            health_timeout_s, HEALTH_TIMEOUT.get(), "Router health_timeout_s"
        )
        self._start_timeout = check_timeout(
            start_timeout_s, START_TIMEOUT.get(), "Router start_timeout_s"
        )
        interval = None
        if health_interval_s is not None:
            interval = check_timeout(health_interval_s, 0.0, "Router health_interval_s")
        self._cond = threading.Condition()
        self._servers: dict[str, ServerEntry] = {}
        self._where: dict[str, ServerEntry] = {}
        self._update: WeightUpdate | None = None
        self._picks = 0
        self._closed = False
        self._workers: set[threading.Thread] = set()
        self._monitor: threading.Thread | None = None
        for url in urls:
            self.add_server(url)
        if interval is not None:
            self._monitor = threading.Thread(
                target=self._watch, args=(interval,), name="sc-rollout-health", daemon=True
            )
            self._monitor.start()

    # --- servers ----------------------------------------------------------------------------

    def add_server(self, url: str, *, name: str | None = None) -> str:
        """Add the server at ``url`` under ``name`` (default: the URL) and return the name.

        Returns once the server is healthy and holds the router's current weight version (it
        is given the current :class:`WeightUpdate` first); it then takes requests.
        """
        name = url if name is None else name
        if not isinstance(name, str) or not name:
            raise RolloutTypeError(f"Router.add_server: name must be a non-empty str, got {name!r}")
        entry = ServerEntry(name, url, self._client(url))
        with self._cond:
            self._check_open()
            if name in self._servers:
                raise DuplicateServerError(
                    f"Router.add_server({url!r}): a server named {name!r} is already held "
                    f"(at {self._servers[name].url})"
                )
            self._servers[name] = entry
        try:
            up = self._bring_up(entry, 0)
        except BaseException:
            with self._cond:
                self._drop(entry)
            raise
        if not up:
            with self._cond:
                self._check_open()
        _log.info("server %s (%s) added", name, url)
        return name

    def remove_server(
        self, name: str, *, wait: bool = True, timeout_s: float | None = None
    ) -> None:
        """Take server ``name`` out: it gets no new request (its sessions move on their next
        request), and it is forgotten once its requests in flight are answered. With
        ``wait``, return only then (:class:`RolloutTimeoutError` after ``timeout_s``)."""
        with self._cond:
            entry = self._entry(name, "remove_server")
            if entry.in_flight == 0 or entry.state not in (ServerState.LIVE, ServerState.DRAINING):
                self._drop(entry)
            elif entry.state is ServerState.LIVE:
                entry.state = ServerState.DRAINING
                _log.info("server %s draining (%d in flight)", name, entry.in_flight)
            self._cond.notify_all()
            if wait and not self._cond.wait_for(
                lambda: self._servers.get(name) is not entry, timeout_s
            ):
                raise RolloutTimeoutError(
                    f"Router.remove_server({name!r}): {entry.in_flight} request(s) still in "
                    f"flight after {timeout_s:g} s"
                )

    def servers(self) -> list[ServerStatus]:
        """Every server held, in the order they were added."""
        with self._cond:
            return [entry.status() for entry in self._servers.values()]

    def session_server(self, session_id: str) -> str | None:
        """The server session ``session_id`` sticks to, if the router remembers it."""
        with self._cond:
            return self._affinity.peek(session_id)

    @property
    def weight_version(self) -> int | None:
        """The version of the last weights pushed (``None``: none yet)."""
        with self._cond:
            return None if self._update is None else self._update.version

    # --- requests ---------------------------------------------------------------------------

    def generate(self, request: GenerateRequest) -> GenerateResult:
        """Send ``request`` to a server (see the module's documentation); the result's
        ``server`` names the server that answered.

        A server that cannot be reached is checked and, if dead, taken out, and the request
        goes to another (:class:`NoLiveServerError` after ``max_attempts`` servers, or when
        no server is live or coming back within ``start_timeout_s``). Errors of the request
        itself (:class:`RolloutRequestError`, ...) and timeouts are raised as they are.
        """
        if not isinstance(request, GenerateRequest):
            raise RolloutTypeError(
                f"Router.generate() takes a GenerateRequest, got {type(request).__name__}"
            )
        failures: list[str] = []
        for _ in range(self._max_attempts):
            entry, client, incarnation = self._acquire(request)
            try:
                result = client.generate(request)
            except ServerUnavailableError as exc:
                self._release(entry, request.request_id, served=False)
                failures.append(f"{entry.name}: {exc}")
                self._suspect(entry, client, incarnation, failures[-1])
                continue
            except RolloutServerError as exc:  # an answer that is no result: name the server
                self._release(entry, request.request_id, served=False)
                raise RolloutServerError(
                    f"Router.generate(request {request.request_id}): server {entry.name} "
                    f"answered with no valid result: {exc}"
                ) from exc
            except BaseException:
                self._release(entry, request.request_id, served=False)
                raise
            self._release(entry, request.request_id, served=True)
            return dataclasses.replace(result, server=entry.name)
        raise NoLiveServerError(
            f"Router.generate(request {request.request_id}): no server answered in "
            f"{self._max_attempts} attempts: " + "; ".join(failures)
        )

    def abort(self, request_id: str) -> bool:
        """Abort request ``request_id`` on the server that runs it (its ``generate`` returns
        the tokens so far); ``True`` if it was in flight there."""
        with self._cond:
            entry = self._where.get(request_id)
            client = None if entry is None else entry.client
        return False if client is None else client.abort(request_id)

    def _acquire(self, request: GenerateRequest) -> tuple[ServerEntry, RolloutClient, int]:
        """A live server for ``request`` (its session's, else the least loaded), counted in
        flight; waits while servers are coming back."""
        deadline: float | None = None
        rid = request.request_id
        with self._cond:
            while True:
                self._check_open()
                live = {n: e for n, e in self._servers.items() if e.state is ServerState.LIVE}
                if live:
                    break
                if not any(e.state in WAITING for e in self._servers.values()):
                    raise NoLiveServerError(
                        f"Router.generate(request {rid}): no live server ({self._states()})"
                    )
                deadline = deadline or time.monotonic() + self._start_timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoLiveServerError(
                        f"Router.generate(request {rid}): no server came back within "
                        f"{self._start_timeout:g} s ({self._states()})"
                    )
                self._cond.wait(left)
            if rid in self._where:
                raise RolloutRequestError(
                    f"Router.generate: request id {rid!r} is already in flight"
                )
            session = request.session_id
            name = None if session is None else self._affinity.get(session)
            if name not in live:
                name = least_loaded({n: (e.in_flight, e.last_pick) for n, e in live.items()})
            if session is not None:
                self._affinity.put(session, name)
            entry = live[name]
            self._picks += 1
            entry.last_pick = self._picks
            entry.in_flight += 1
            self._where[rid] = entry
            return entry, entry.client, entry.incarnation

    def _release(self, entry: ServerEntry, request_id: str, served: bool) -> None:
        with self._cond:
            entry.in_flight -= 1
            if served:
                entry.served += 1
            self._where.pop(request_id, None)
            if entry.state is ServerState.DRAINING and entry.in_flight == 0:
                self._drop(entry)
            self._cond.notify_all()

    # --- weights ----------------------------------------------------------------------------

    def push_weights(self, update: WeightUpdate) -> int:
        """Give every server the weights of ``update`` (in parallel) and make it the current
        version: servers added or restarted later get it before they take requests.

        A version below the current one is a :class:`WeightVersionError`. A server that
        cannot be reached is checked (and restarted, hence re-synced, if dead). If every
        server that answered refused the weights, the current version stays what it was
        and the first refusal is raised; servers that refused while others took them are
        taken out. Returns the version.
        """
        if not isinstance(update, WeightUpdate):
            raise RolloutTypeError(
                f"Router.push_weights() takes a WeightUpdate, got {type(update).__name__}"
            )
        with self._cond:
            self._check_open()
            previous = self._update
            if previous is not None and update.version < previous.version:
                raise WeightVersionError(
                    f"Router.push_weights(version={update.version}) is below the current "
                    f"version, {previous.version}"
                )
            self._update = update
            targets = self._targets()
        outcomes = broadcast([c for _, c, _ in targets], lambda client: client.load_weights(update))
        refused: list[tuple[ServerEntry, int, ScRolloutError]] = []
        loaded = 0
        for (entry, client, incarnation), outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, (ServerUnavailableError, RolloutTimeoutError)):
                self._suspect(
                    entry, client, incarnation, f"weights version {update.version}: {outcome}"
                )
            elif isinstance(outcome, ScRolloutError):
                refused.append((entry, incarnation, outcome))
            else:
                loaded += 1
                with self._cond:
                    if entry.incarnation == incarnation:
                        entry.weight_version = update.version
        if refused and not loaded:
            with self._cond:
                if self._update is update:
                    self._update = previous
            raise refused[0][2]
        for entry, incarnation, exc in refused:
            self._mark_dead(entry, incarnation, f"refused weights version {update.version}: {exc}")
        _log.info("weights version %d pushed to %d server(s)", update.version, loaded)
        return update.version

    # --- health -----------------------------------------------------------------------------

    def check_health(self) -> list[ServerStatus]:
        """Check every live and draining server now (in parallel, each within the health
        deadline): a failed check takes the server out (and restarts it); a server that
        reports another weight version than the current one is re-synced before it takes
        requests again. Returns :meth:`servers`."""
        with self._cond:
            targets = self._targets()
        outcomes = broadcast([c for _, c, _ in targets], lambda client: client.health())
        for (entry, _client, incarnation), outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self._mark_dead(entry, incarnation, f"health check failed: {outcome}")
                continue
            with self._cond:
                if entry.incarnation != incarnation:
                    continue
                entry.weight_version = outcome.weight_version
                current = self._update
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
        return self.servers()

    def _suspect(
        self, entry: ServerEntry, client: RolloutClient, incarnation: int, reason: str
    ) -> None:
        """A call to ``entry`` failed: check its health, and take it out if that fails too."""
        try:
            client.health()
        except ScRolloutError as exc:
            self._mark_dead(entry, incarnation, f"{reason}; then its health check: {exc}")

    def _mark_dead(self, entry: ServerEntry, incarnation: int, reason: str) -> None:
        """Take ``entry`` out (once per incarnation): cut its calls in flight, and restart it
        if there is a restart hook (a draining server is just forgotten)."""
        with self._cond:
            if entry.incarnation != incarnation or self._servers.get(entry.name) is not entry:
                return
            client = entry.client
            entry.error = reason
            if entry.state is ServerState.DRAINING:
                self._drop(entry)
            else:
                entry.incarnation += 1
                if self._restart is not None and not self._closed:
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
            client = self._client(url)
            with self._cond:
                if entry.incarnation != incarnation:
                    return
                entry.url = url
                entry.client = client
                entry.restarts += 1
                entry.state = ServerState.SYNCING
            if self._bring_up(entry, incarnation):
                _log.info("server %s restarted at %s", entry.name, url)
        except Exception as exc:
            self._fail(entry, incarnation, f"restart failed: {type(exc).__name__}: {exc}")

    def _resync(self, entry: ServerEntry, incarnation: int) -> None:
        """Bring a live server that holds the wrong weights up again (a syncing thread)."""
        try:
            self._bring_up(entry, incarnation)
        except Exception as exc:
            self._fail(entry, incarnation, f"re-sync failed: {type(exc).__name__}: {exc}")

    def _fail(self, entry: ServerEntry, incarnation: int, reason: str) -> None:
        _log.error("server %s stays out: %s", entry.name, reason)
        with self._cond:
            if entry.incarnation == incarnation and self._servers.get(entry.name) is entry:
                entry.state = ServerState.DEAD
                entry.error = reason
                self._cond.notify_all()

    def _bring_up(self, entry: ServerEntry, incarnation: int) -> bool:
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
                    self._closed
                    or entry.incarnation != incarnation
                    or self._servers.get(entry.name) is not entry
                ):
                    return False
                if self._update is pushed:
                    entry.weight_version = version
                    entry.state = ServerState.LIVE
                    self._cond.notify_all()
                    return True
                pushed = self._update
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
                    if self._cond.wait_for(lambda: self._closed, min(pause, left)):
                        raise RouterClosedError(
                            f"Router closed while {entry.name!r} started"
                        ) from None
                pause = min(pause * 2, 0.5)

    # --- plumbing ---------------------------------------------------------------------------

    def _client(self, url: str) -> RolloutClient:
        return RolloutClient(
            url, timeout_s=self._request_timeout, health_timeout_s=self._health_timeout
        )

    def _check_open(self) -> None:
        if self._closed:
            raise RouterClosedError("the router is closed")

    def _entry(self, name: str, method: str) -> ServerEntry:
        entry = self._servers.get(name)
        if entry is None:
            raise UnknownServerError(
                f"Router.{method}({name!r}): no such server; the router holds "
                f"{sorted(self._servers)}"
            )
        return entry

    def _drop(self, entry: ServerEntry) -> None:
        """Forget ``entry`` (under the lock); a sync of it in progress stops."""
        if self._servers.get(entry.name) is not entry:
            return
        del self._servers[entry.name]
        entry.incarnation += 1
        _log.info("server %s removed", entry.name)

    def _states(self) -> str:
        return ", ".join(f"{n}: {e.state.value}" for n, e in self._servers.items()) or "none"

    def _targets(self) -> list[tuple[ServerEntry, RolloutClient, int]]:
        """The servers a broadcast goes to (under the lock): live and draining ones."""
        return [
            (e, e.client, e.incarnation)
            for e in self._servers.values()
            if e.state in (ServerState.LIVE, ServerState.DRAINING)
        ]

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

    def _watch(self, interval: float) -> None:
        while True:
            with self._cond:
                if self._cond.wait_for(lambda: self._closed, interval):
                    return
            try:
                self.check_health()
            except Exception:
                _log.exception("the periodic health check failed")

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop checking and restarting servers; later calls raise
        :class:`RouterClosedError` (requests in flight still finish)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            threads = [*self._workers, *([self._monitor] if self._monitor else [])]
        for thread in threads:
            thread.join(timeout_s)

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Router({self._states()})"
