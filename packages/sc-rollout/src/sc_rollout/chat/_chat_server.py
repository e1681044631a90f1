"""``ChatServer``: a :class:`~sc_rollout.ChatFront` behind OpenAI's chat-completions HTTP API.

Endpoints (JSON bodies)::

    POST /v1/chat/completions   OpenAI's chat completion (session id: body field session_id
                                or header X-Session-Id); the answer carries sc_session_id
    GET  /v1/models             the model served
    GET  /health                {"status": "ok", "model": ..., "sessions": int}

Errors answer with OpenAI's error body and the status the rollout server uses (400 a bad
request, a template that diverges or a history that does not extend its session; 409 a
session with a request in flight or an engine's state; 404 an unknown endpoint; 500
otherwise). Bodies are read within the rollout server's limits (``_server.py``: 400, 408,
411, 413). An answer's ``X-Session-Id`` header echoes its session id when that is a plain
printable ASCII header value (``sc_session_id`` in the body always does). Each request runs
on a thread of its own.
"""

from __future__ import annotations

import functools
import logging
from typing import Any
from urllib.parse import urlsplit

from .._errors import RolloutConfigError, RolloutTypeError
from ..serving._http import (
    Answer,
    JsonHandler,
    JsonHTTPServer,
    ServingThread,
    check_host,
    server_url,
)
from ._chat_front import ChatFront

__all__ = ["ChatServer"]

_log = logging.getLogger("sc_rollout.chat")

_COMPLETIONS = "/v1/chat/completions"
_ENDPOINTS = {("POST", _COMPLETIONS), ("GET", "/v1/models"), ("GET", "/health")}


class _HTTPServer(JsonHTTPServer):
    def __init__(self, address: tuple[str, int], front: ChatFront) -> None:
        self.front = front
        super().__init__(address, _Handler)


class _Handler(JsonHandler):
    server: _HTTPServer
    server_version = "sc-rollout-chat"
    logger = _log

    def _route_path(self) -> str:
        return urlsplit(self.path).path.rstrip("/")

    def _endpoint(self, method: str, path: str) -> Answer | None:
        if (method, path) not in _ENDPOINTS:
            return None
        return functools.partial(self._answer, path)

    def _known(self, path: str) -> bool:
        return any(p == path for _, p in _ENDPOINTS)

    def _extra_headers(self, body: dict[str, Any]) -> dict[str, str]:
        session_id = body.get("sc_session_id")
        return {"X-Session-Id": session_id} if isinstance(session_id, str) else {}

    def _answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        front = self.server.front
        if path == _COMPLETIONS:
            return front.complete(body, session_id=self.headers.get("X-Session-Id"))
        if path == "/health":
            return {"status": "ok", "model": front.model, "sessions": len(front)}
        entry = {"id": front.model, "object": "model", "created": 0, "owned_by": "sc-rollout"}
        return {"object": "list", "data": [entry]}


class ChatServer(ServingThread):
    """Serves ``front`` (a :class:`~sc_rollout.ChatFront`) over HTTP at ``host:port``: an
    OpenAI-compatible chat-completions endpoint (see the module's endpoints), so agent code
    written against an OpenAI client runs unchanged with ``openai.OpenAI(base_url=server.url,
    api_key=...)`` and its conversations are recorded as sessions.

    ``host`` defaults to ``SC_ROLLOUT_HOST`` (``127.0.0.1``); addresses of every interface are
    refused. ``port`` 0 takes a free port. The socket is bound on construction; :meth:`start`
    serves from a daemon thread, :meth:`serve_forever` from the calling one;
    ``with ChatServer(front) as server:`` starts and stops.
    """

    def __init__(self, front: ChatFront, *, host: str | None = None, port: int = 0) -> None:
        if not isinstance(front, ChatFront):
            raise RolloutTypeError(
                f"ChatServer(front=...) takes a ChatFront, got {type(front).__name__}"
            )
        bind = check_host(host, "ChatServer")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise RolloutConfigError(f"ChatServer: port must be an int in 0..65535, got {port!r}")
        self._front = front
        super().__init__(_HTTPServer((bind, port), front), bind, "sc-rollout-chat")

    @property
    def front(self) -> ChatFront:
        """The chat front served (its :meth:`~sc_rollout.ChatFront.sessions` are the
        recorded conversations)."""
        return self._front

    @property
    def url(self) -> str:
        """``http://host:port/v1``: the ``base_url`` of an OpenAI client."""
        return server_url(self._host, self._port) + "/v1"

    def __repr__(self) -> str:
        return f"ChatServer({self.url}, model={self._front.model!r})"
