"""``Router``: generation requests spread over rollout servers, on the caller's side.

A request of a session goes where the session went before (a bounded LRU map); any other
request to the live server with the fewest requests in flight. Servers are added (checked
healthy and given the current weights first) and removed (drained: no new requests, those
in flight finish) at any time. A server that fails a request (refused, reset) and then its
health check, or that fails a periodic health check, is out: its requests in flight are cut
and sent again to a live server, so every request is answered once; the owner's restart hook
brings it back, and it takes requests again only once it holds the current weight version.
That health and restart state machine is :class:`~._health.ServerHealth`, which shares a
:class:`~._health.RouterState` (the lock, the servers, the current weights) with the router.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable

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
from ..engines._types import GenerateRequest, GenerateResult, WeightUpdate, check_int
from ..serving._client import RolloutClient, check_timeout
from ._affinity import AffinityMap, least_loaded
from ._health import RouterState, ServerHealth
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
        self._affinity = AffinityMap(session_capacity)
        self._max_attempts = check_int(max_attempts, "Router max_attempts", 1, RolloutConfigError)
        request_timeout = check_timeout(
            request_timeout_s, REQUEST_TIMEOUT.get(), "Router request_timeout_s"
        )
        health_timeout = check_timeout(
            health_timeout_s, HEALTH_TIMEOUT.get(), "Router health_timeout_s"
        )
        self._start_timeout = check_timeout(
            start_timeout_s, START_TIMEOUT.get(), "Router start_timeout_s"
        )
        interval = None
        if health_interval_s is not None:
            interval = check_timeout(health_interval_s, 0.0, "Router health_interval_s")
        self._state = RouterState()
        self._cond = self._state.cond
        self._health = ServerHealth(
            self._state,
            restart=restart,
            request_timeout=request_timeout,
            health_timeout=health_timeout,
            start_timeout=self._start_timeout,
        )
        self._where: dict[str, ServerEntry] = {}
        self._picks = 0
        for url in urls:
            self.add_server(url)
        if interval is not None:
            self._health.watch(interval, self.check_health)

    # --- servers ----------------------------------------------------------------------------

    def add_server(self, url: str, *, name: str | None = None) -> str:
        """Add the server at ``url`` under ``name`` (default: the URL) and return the name.

        Returns once the server is healthy and holds the router's current weight version (it
        is given the current :class:`WeightUpdate` first); it then takes requests.
        """
        name = url if name is None else name
        if not isinstance(name, str) or not name:
            raise RolloutTypeError(f"Router.add_server: name must be a non-empty str, got {name!r}")
        entry = ServerEntry(name, url, self._health.client(url))
        with self._cond:
            self._check_open()
            if name in self._state.servers:
                raise DuplicateServerError(
                    f"Router.add_server({url!r}): a server named {name!r} is already held "
                    f"(at {self._state.servers[name].url})"
                )
            self._state.servers[name] = entry
        try:
            up = self._health.bring_up(entry, 0)
        except BaseException:
            with self._cond:
                self._state.drop(entry)
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
                self._state.drop(entry)
            elif entry.state is ServerState.LIVE:
                entry.state = ServerState.DRAINING
                _log.info("server %s draining (%d in flight)", name, entry.in_flight)
            self._cond.notify_all()
            if wait and not self._cond.wait_for(
                lambda: self._state.servers.get(name) is not entry, timeout_s
            ):
                raise RolloutTimeoutError(
                    f"Router.remove_server({name!r}): {entry.in_flight} request(s) still in "
                    f"flight after {timeout_s:g} s"
                )

    def servers(self) -> list[ServerStatus]:
        """Every server held, in the order they were added."""
        with self._cond:
            return [entry.status() for entry in self._state.servers.values()]

    def session_server(self, session_id: str) -> str | None:
        """The server session ``session_id`` sticks to, if the router remembers it."""
        with self._cond:
            return self._affinity.peek(session_id)

    @property
    def weight_version(self) -> int | None:
        """The version of the last weights pushed (``None``: none yet)."""
        with self._cond:
            return None if self._state.update is None else self._state.update.version

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
                self._health.suspect(entry, client, incarnation, failures[-1])
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
                live = {n: e for n, e in self._state.servers.items() if e.state is ServerState.LIVE}
                if live:
                    break
                if not any(e.state in WAITING for e in self._state.servers.values()):
                    raise NoLiveServerError(
                        f"Router.generate(request {rid}): no live server ({self._state.states()})"
                    )
                deadline = deadline or time.monotonic() + self._start_timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoLiveServerError(
                        f"Router.generate(request {rid}): no server came back within "
                        f"{self._start_timeout:g} s ({self._state.states()})"
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
                self._state.drop(entry)
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
            previous = self._state.update
            if previous is not None and update.version < previous.version:
                raise WeightVersionError(
                    f"Router.push_weights(version={update.version}) is below the current "
                    f"version, {previous.version}"
                )
            self._state.update = update
            targets = self._state.targets()
        outcomes = broadcast([c for _, c, _ in targets], lambda client: client.load_weights(update))
        refused: list[tuple[ServerEntry, int, ScRolloutError]] = []
        loaded = 0
        for (entry, client, incarnation), outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, (ServerUnavailableError, RolloutTimeoutError)):
                self._health.suspect(
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
                if self._state.update is update:
                    self._state.update = previous
            raise refused[0][2]
        for entry, incarnation, exc in refused:
            self._health.mark_dead(
                entry, incarnation, f"refused weights version {update.version}: {exc}"
            )
        _log.info("weights version %d pushed to %d server(s)", update.version, loaded)
        return update.version

    # --- health -----------------------------------------------------------------------------

    def check_health(self) -> list[ServerStatus]:
        """Check every live and draining server now (in parallel, each within the health
        deadline): a failed check takes the server out (and restarts it); a server that
        reports another weight version than the current one is re-synced before it takes
        requests again. Returns :meth:`servers`."""
        self._health.check()
        return self.servers()

    # --- plumbing ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state.closed:
            raise RouterClosedError("the router is closed")

    def _entry(self, name: str, method: str) -> ServerEntry:
        entry = self._state.servers.get(name)
        if entry is None:
            raise UnknownServerError(
                f"Router.{method}({name!r}): no such server; the router holds "
                f"{sorted(self._state.servers)}"
            )
        return entry

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop checking and restarting servers; later calls raise
        :class:`RouterClosedError` (requests in flight still finish)."""
        with self._cond:
            self._state.closed = True
            self._cond.notify_all()
            threads = self._health.threads()
        for thread in threads:
            thread.join(timeout_s)

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Router({self._state.states()})"
