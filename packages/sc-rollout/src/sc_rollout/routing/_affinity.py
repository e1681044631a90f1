"""The router's two choices, kept free of I/O so that they can be tested alone: session
affinity (which server an agent session's requests stick to, a bounded LRU map) and which
server is least loaded."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from .._errors import RolloutConfigError
from ..engines._types import check_int

__all__ = ["AffinityMap", "least_loaded"]


class AffinityMap:
    """Session affinity: an agent session's id to the server its requests go to, holding
    the ``capacity`` sessions used most recently (the least recently used one is forgotten
    first). Not thread-safe: the router locks."""

    def __init__(self, capacity: int) -> None:
        self._capacity = check_int(capacity, "session_capacity", 1, RolloutConfigError)
        self._map: OrderedDict[str, str] = OrderedDict()

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._map)

    def get(self, session: str) -> str | None:
        """The session's server, marking the session used; ``None`` if not held."""
        server = self._map.get(session)
        if server is not None:
            self._map.move_to_end(session)
        return server

    def peek(self, session: str) -> str | None:
        """The session's server, without marking it used."""
        return self._map.get(session)

    def put(self, session: str, server: str) -> None:
        """Stick ``session`` to ``server`` (forgetting the least recently used session when
        full)."""
        self._map[session] = server
        self._map.move_to_end(session)
        while len(self._map) > self._capacity:
            self._map.popitem(last=False)

    def items(self) -> list[tuple[str, str]]:
        """``(session, server)`` from the least to the most recently used."""
        return list(self._map.items())


def least_loaded(loads: Mapping[str, tuple[int, int]]) -> str:
    """The server with the fewest requests in flight among ``loads`` (name to
    ``(in_flight, last_pick)``); among equals the one picked longest ago, then the first
    name, so that idle servers take turns."""
    if not loads:
        raise RolloutConfigError("least_loaded() of no servers")
    return min(loads, key=lambda name: (loads[name][0], loads[name][1], name))
