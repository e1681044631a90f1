"""``ChatServer``: a :class:`~sc_rollout.ChatFront` behind OpenAI's chat-completions HTTP API.

Endpoints (JSON bodies)::

    POST /v1/chat/completions   OpenAI's chat completion (session id: body field session_id
                                or header X-Session-Id); the answer carries sc_session_id
    GET  /v1/models             the model served
    GET  /health                {"status": "ok", "model": ..., "sessions": int}

Errors answer with OpenAI's error body and the status the rollout server uses (400 a bad
request, a template that diverges or a history that does not extend its session; 409 a
session with a request in flight or an engine's state; 404 an unknown endpoint; 500
otherwise). Each request runs on a thread of its own.
"""

from __future__ import annotations

import json
import logging
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ._chat_front import ChatFront
from ._errors import RolloutConfigError, RolloutTypeError, ScRolloutError
from ._server import ServingThread, check_host, server_url
from ._wire import decode_body, error_body, error_status

__all__ = ["ChatServer"]

_log = logging.getLogger("sc_rollout.chat")

_COMPLETIONS = "/v1/chat/completions"
_ENDPOINTS = {("POST", _COMPLETIONS), ("GET", "/v1/models"), ("GET", "/health")}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], front: ChatFront) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.front = front
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = "sc-rollout-chat"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s %s", self.address_string(), format % args)

    def _dispatch(self, method: str) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        where = f"{method} {path}"
        if (method, path) not in _ENDPOINTS:
            known = any(p == path for _, p in _ENDPOINTS)
            status, kind = (405, "MethodNotAllowed") if known else (404, "NotFound")
            self._send(status, error_body(kind, f"{where}: no such endpoint", status))
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = decode_body(self.rfile.read(length), where) if length else {}
            answer = self._answer(path, body)
        except ScRolloutError as exc:
            status = error_status(exc)
            self._send(status, error_body(type(exc).__name__, str(exc), status))
        except Exception as exc:
            _log.exception("%s failed", where)
            message = f"{where}: {type(exc).__name__}: {exc}"
            self._send(500, error_body("InternalServerError", message, 500))
        else:
            self._send(200, answer)

    def _answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        front = self.server.front
        if path == _COMPLETIONS:
            return front.complete(body, session_id=self.headers.get("X-Session-Id"))
        if path == "/health":
            return {"status": "ok", "model": front.model, "sessions": len(front)}
        entry = {"id": front.model, "object": "model", "created": 0, "owned_by": "sc-rollout"}
        return {"object": "list", "data": [entry]}

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            session_id = body.get("sc_session_id")
            if isinstance(session_id, str):
                self.send_header("X-Session-Id", session_id)
            self.end_headers()
            self.wfile.write(data)
        except OSError as exc:  # the client went away
            _log.debug("%s: the answer could not be sent: %s", self.path, exc)


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
