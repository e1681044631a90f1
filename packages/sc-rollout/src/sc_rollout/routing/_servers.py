"""The servers of a router: their states, the status a caller sees, the record the router
keeps of each (under its lock), and a broadcast of one call to several servers."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .._errors import ScRolloutError
from ..serving._client import RolloutClient

__all__ = ["RestartHook", "ServerEntry", "ServerState", "ServerStatus", "WAITING", "broadcast"]

_T = TypeVar("_T")

#: the owner's way to bring a dead server back: called with the server's name (on a thread
#: of the router's), returns the URL the restarted server listens on (the same or a new one)
RestartHook = Callable[[str], str]


class ServerState(str, enum.Enum):
    """Where a server of a router stands. Only ``LIVE`` servers take new requests."""

    LIVE = "live"
    #: added or restarted, being checked healthy and given the current weights
    SYNCING = "syncing"
    #: being removed: its requests in flight finish, no new ones come
    DRAINING = "draining"
    #: found dead; the restart hook is running
    RESTARTING = "restarting"
    #: found dead, and no restart hook brought it back (see ``ServerStatus.error``)
    DEAD = "dead"


@dataclass(frozen=True)
class ServerStatus:
    """One server of a router: its name and URL, state, requests in flight and answered,
    restarts, the weight version it last reported, and its last failure (kept once it is
    back, ``None`` if it never failed)."""

    name: str
    url: str
    state: ServerState
    in_flight: int
    served: int
    restarts: int
    weight_version: int | None
    error: str | None


class ServerEntry:
    """A server's record; every field is guarded by the router's lock. ``incarnation`` grows
    each time the server is found dead or removed, so that late news about a former
    incarnation (a failure, a finished sync) is recognised and ignored."""

    def __init__(self, name: str, url: str, client: RolloutClient) -> None:
        self.name = name
        self.url = url
        self.client = client
        self.state = ServerState.SYNCING
        self.in_flight = 0
        self.served = 0
        self.restarts = 0
        self.last_pick = 0
        self.weight_version: int | None = None
        self.error: str | None = None
        self.incarnation = 0

    def status(self) -> ServerStatus:
        return ServerStatus(
            name=self.name,
            url=self.url,
            state=self.state,
            in_flight=self.in_flight,
            served=self.served,
            restarts=self.restarts,
            weight_version=self.weight_version,
            error=self.error,
        )


WAITING = frozenset({ServerState.SYNCING, ServerState.RESTARTING})


def broadcast(
    clients: Sequence[RolloutClient], call: Callable[[RolloutClient], _T]
) -> list[_T | ScRolloutError]:
    """``call`` on every client at once, one thread each; each outcome or its sc-rollout
    error, in the clients' order."""
    outcomes: list[_T | ScRolloutError] = [ScRolloutError("not run")] * len(clients)

    def run(index: int, client: RolloutClient) -> None:
        try:
            outcomes[index] = call(client)
        except ScRolloutError as exc:
            outcomes[index] = exc

    threads = [
        threading.Thread(target=run, args=(i, client), daemon=True)
        for i, client in enumerate(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes
