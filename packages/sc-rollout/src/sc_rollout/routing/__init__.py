"""A router over rollout servers.

:class:`Router` spreads requests over servers: sticky by session, least in flight otherwise,
servers added and drained at runtime, dead ones retried elsewhere, restarted through the
owner's :data:`RestartHook` and re-synced to the current weights; ``Router.servers()``
reports each server's :class:`ServerStatus` (its :class:`ServerState`, in flight, restarts).
"""

from __future__ import annotations

from sc_dispatch import _public

from ._router import Router
from ._servers import RestartHook, ServerState, ServerStatus

__all__ = ["RestartHook", "Router", "ServerState", "ServerStatus"]

_public.publish(globals())
