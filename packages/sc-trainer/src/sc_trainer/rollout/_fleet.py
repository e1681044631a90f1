"""``RolloutServerFleet``: rollout server processes placed by Ray, behind one router.

Each server is a process of its own (:class:`sc_rollout.ServerProcess`), owned by a small Ray
actor (:class:`RolloutServerActor`) that runs on one bundle of a resource pool: the actor
starts the process on its node, bound to the node's address (never every interface), and
can restart it (kill and start again), kill it (a crash, for tests) or stop it. The command
line comes from the caller's factory ``(host, port) -> argv``, so one fleet runs toy servers
(tests), the built-in torch engine or vLLM (another interpreter). The server's environment
is the actor's (``CUDA_VISIBLE_DEVICES`` and the rest, as Ray set them) plus ``env``.

The fleet builds a :class:`sc_rollout.Router` over its servers, named ``<prefix>-<i>``;
the router's restart hook restarts a dead server through its actor, and the router then
re-syncs it to the current weight version before it takes requests again.

A detached run's fleet (``detached=True``) names its actors ``<prefix>-<i>`` in the run's
Ray namespace and lets them outlive the driver; a driver that re-attaches builds the fleet
with ``adopt=True``: it takes over the live actors of those names (a server whose process
died meanwhile is started again by its actor, and the URL of each is read from its actor),
creates an actor only for a name that has none, and builds a new router over them.

Multi-node: every node must reach the driver's router, and the weight directory pushed to
the servers (:class:`~sc_trainer.rollout.WeightPublisher`) must be on storage every node sees.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sc_rollout import Router
from sc_rollout.routing import ServerStatus

from .._errors import RolloutFleetError
from ._fleet_ray import BundlePlace, RemoteActor, bundle_places, cpu_pool
from ._server_actor import ArgvFactory, RolloutServerActor

if TYPE_CHECKING:  # a type only: importing sc_ray imports Ray
    from sc_ray import RayResourcePool

__all__ = ["ArgvFactory", "RolloutServerActor", "RolloutServerFleet"]

logger = logging.getLogger(__name__)

#: seconds a Ray actor gets to be scheduled and import its module, on top of the start
_ACTOR_SLACK_S = 120.0
#: seconds a control call (kill, stop, pid) on an actor may take
_CONTROL_TIMEOUT_S = 30.0


class RolloutServerFleet:
    """Rollout servers in Ray actors, and a :class:`sc_rollout.Router` over them (see the
    module's documentation).

    ``argv_factory(host, port)``: a server's command line. The servers run on the bundles of
    ``pool`` (a :class:`sc_ray.RayResourcePool`; one server per process of the pool, each
    actor asking the pool's per-actor share), or, without a pool, on a CPU pool of
    ``num_servers`` processes of ``num_cpus_per_server`` CPUs on one node, which the fleet
    owns and releases. ``env`` is added to each server's environment. ``start_timeout_s``:
    how long a server may take to print its ready line, or to be healthy again after a
    restart (a model server loads its weights first). ``request_timeout_s``,
    ``health_interval_s`` and ``max_attempts`` are the router's.

    ``detached``: the actors are named (:meth:`actor_names`) and outlive this driver (a
    detached run's); ``adopt``: take over the live actors of those names first (a driver
    that re-attaches to the run), see the module's documentation.

    A server that fails to start is a :class:`RolloutFleetError` naming its index and
    command line (the servers started are stopped first, unless the fleet is detached:
    they are the run's). :meth:`close` stops everything; ``with`` closes.
    """

    def __init__(
        self,
        argv_factory: ArgvFactory,
        num_servers: int | None = None,
        *,
        pool: RayResourcePool | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 300.0,
        name_prefix: str = "rollout",
        num_cpus_per_server: float = 1.0,
        request_timeout_s: float | None = None,
        health_interval_s: float | None = None,
        max_attempts: int = 4,
        detached: bool = False,
        adopt: bool = False,
    ) -> None:
        if not callable(argv_factory):
            raise RolloutFleetError(
                f"RolloutServerFleet: argv_factory must be callable, got {argv_factory!r}"
            )
        if pool is None and (
            isinstance(num_servers, bool) or not isinstance(num_servers, int) or num_servers < 1
        ):
            raise RolloutFleetError(
                "RolloutServerFleet: give num_servers (an int >= 1) or a resource pool, got "
                f"num_servers={num_servers!r}"
            )
        self._prefix = name_prefix
        if (
            isinstance(start_timeout_s, bool)
            or not isinstance(start_timeout_s, (int, float))
            or not start_timeout_s > 0
        ):
            raise RolloutFleetError(
                f"RolloutServerFleet: start_timeout_s must be a number > 0, got {start_timeout_s!r}"
            )
        self._start_timeout = float(start_timeout_s)
        self._lock = threading.Lock()
        self._closed = False
        self._detached = bool(detached or adopt)
        self._adopt = bool(adopt)
        #: the servers this fleet took over from a previous driver (``adopt``), by name
        self.adopted: list[str] = []
        self._owned_pool = pool is None
        if pool is None:
            pool = cpu_pool(int(num_servers or 0), f"{name_prefix}_fleet_", num_cpus_per_server)
        self._pool = pool
        self._actors: dict[str, RemoteActor] = {}
        self._router: Router | None = None
        try:
            places = bundle_places(pool)
            if num_servers is not None and num_servers != len(places):
                raise RolloutFleetError(
                    f"RolloutServerFleet: num_servers={num_servers}, but the pool has "
                    f"{len(places)} processes (one server each)"
                )
            urls = self._start_all(argv_factory, places, dict(env or {}))
            self._router = Router(
                restart=self.restart_server,
                request_timeout_s=request_timeout_s,
                start_timeout_s=self._start_timeout,
                health_interval_s=health_interval_s,
                max_attempts=max_attempts,
            )
            for name, url in urls.items():
                self._router.add_server(url, name=name)
        except BaseException:
            if self._detached:  # the run's servers: a later driver adopts them
                self._close_router()
            else:
                self.close()
            raise
        logger.info("rollout fleet of %d server(s) up: %s", len(urls), urls)

    @staticmethod
    def actor_names(name_prefix: str, num_servers: int) -> list[str]:
        """The names of the servers (and of their actors) of a fleet: ``<prefix>-<i>``."""
        return [f"{name_prefix}-{index}" for index in range(num_servers)]

    def _new_actor(
        self, index: int, place: BundlePlace, factory: ArgvFactory, env: dict[str, str]
    ) -> RemoteActor:
        name = f"{self._prefix}-{index}"
        args = (index, factory, env, self._start_timeout)
        return RemoteActor(RolloutServerActor, place, name, args, detached=self._detached)

    def _start_all(
        self, factory: ArgvFactory, places: list[BundlePlace], env: dict[str, str]
    ) -> dict[str, str]:
        """Create every server's actor (or, with ``adopt``, find the live one of its name)
        and start every server (an adopted one whose process runs answers with its URL), all
        at once; their URLs. An adopted actor that dies before it answers is replaced by a
        new one, once."""
        names = self.actor_names(self._prefix, len(places))
        for index, (name, place) in enumerate(zip(names, places, strict=True)):
            found = RemoteActor.find(name) if self._adopt else None
            if found is not None:
                self.adopted.append(name)
            self._actors[name] = found or self._new_actor(index, place, factory, env)
        pending = {name: actor.call_async("start") for name, actor in self._actors.items()}
        urls: dict[str, str] = {}
        failures: list[str] = []
        for index, (name, ref) in enumerate(pending.items()):
            limit = self._start_timeout + _ACTOR_SLACK_S
            try:
                url = self._actors[name].wait(ref, "start", limit)
            except RolloutFleetError as exc:
                if name not in self.adopted:
                    failures.append(str(exc))
                    continue
                logger.warning("adopted rollout server %s is gone (%s): a new actor", name, exc)
                self.adopted.remove(name)
                self._actors[name].kill()
                self._actors[name] = self._new_actor(index, places[index], factory, env)
                try:
                    url = self._actors[name].call("start", timeout_s=limit)
                except RolloutFleetError as again:
                    failures.append(str(again))
                    continue
            urls[name] = _as_url(url, name)
        if failures:
            raise RolloutFleetError(
                f"RolloutServerFleet: {len(failures)} of {len(places)} server(s) failed to "
                "start: " + "; ".join(failures)
            )
        return urls

    # --- the servers ------------------------------------------------------------------------

    @property
    def router(self) -> Router:
        """The router over the fleet's servers."""
        if self._router is None:
            raise RolloutFleetError("RolloutServerFleet: the fleet did not start")
        return self._router

    @property
    def names(self) -> list[str]:
        """The servers' names (``<prefix>-<i>``), in index order."""
        return list(self._actors)

    def servers(self) -> list[ServerStatus]:
        """The router's view of every server."""
        return self.router.servers()

    def _actor(self, name: str, method: str) -> RemoteActor:
        with self._lock:
            if self._closed:
                raise RolloutFleetError(
                    f"RolloutServerFleet.{method}({name!r}): the fleet is closed"
                )
        actor = self._actors.get(name)
        if actor is None:
            raise RolloutFleetError(
                f"RolloutServerFleet.{method}({name!r}): no such server; the fleet has {self.names}"
            )
        return actor

    def restart_server(self, name: str) -> str:
        """Restart server ``name`` through its actor (kill, start again) and return its new
        URL: the router's restart hook."""
        actor = self._actor(name, "restart_server")
        logger.warning("restarting rollout server %s", name)
        url = actor.call("restart", timeout_s=self._start_timeout + _CONTROL_TIMEOUT_S)
        return _as_url(url, name)

    def kill_server(self, name: str) -> None:
        """Kill server ``name``'s process (SIGKILL, as a crash would); its actor lives on, and
        the router restarts it once it finds it dead."""
        self._actor(name, "kill_server").call("kill", timeout_s=_CONTROL_TIMEOUT_S)

    def server_pid(self, name: str) -> int | None:
        """The process id of server ``name`` on its node (``None`` if it does not run)."""
        pid = self._actor(name, "server_pid").call("pid", timeout_s=_CONTROL_TIMEOUT_S)
        return pid if isinstance(pid, int) else None

    # --- shutdown ---------------------------------------------------------------------------

    def _close_router(self) -> bool:
        """Close the router and mark the fleet closed; ``False`` if it already was."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        if self._router is not None:
            self._router.close()
        return True

    def detach(self) -> None:
        """Close the router and leave the servers running (a detached run's driver that
        stops: the next driver adopts them). Idempotent; :meth:`close` after it does
        nothing."""
        self._close_router()
        logger.info("rollout fleet detached: %d server(s) left running", len(self._actors))

    def close(self) -> None:
        """Close the router, stop every server and its actor, and release the pool if the
        fleet made it. Idempotent."""
        if not self._close_router():
            return
        stops = {name: actor.call_async("stop") for name, actor in self._actors.items()}
        for name, ref in stops.items():
            try:
                self._actors[name].wait(ref, "stop", _CONTROL_TIMEOUT_S)
            except RolloutFleetError as exc:
                logger.warning("rollout fleet close: %s", exc)
        for actor in self._actors.values():
            actor.kill()
        if self._owned_pool:
            self._pool.release()
        logger.info("rollout fleet closed (%d server(s))", len(self._actors))

    def __enter__(self) -> RolloutServerFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else repr(self._router)
        return f"RolloutServerFleet({len(self._actors)} server(s), {state})"


def _as_url(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise RolloutFleetError(f"rollout server {name} answered {value!r}, not a URL")
    return value
