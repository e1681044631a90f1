"""``RolloutServer``: any rollout engine behind an OpenAI-compatible HTTP endpoint.

Endpoints (JSON bodies, see ``_wire.py`` for the completion format)::

    POST /v1/completions   token ids in, token ids and log-probs out, with the weight versions
    GET  /v1/models        the model served and its context length
    GET  /health           the engine's state (weight version, paused, sleeping, in flight)
    POST /abort            {"request_id": ...} -> {"aborted": bool}
    POST /pause, /resume   hold or release every request between two tokens
    GET  /weights          {"weight_version": int}
    POST /weights          {"version": int, "path": str | null} -> {"weight_version": int}
    POST /sleep, /wake_up  {"level": 1 | 2}

Errors answer with OpenAI's error body and a status (400 bad request or type, 409 a version
or state conflict, 422 unreadable weights, 404 unknown endpoint, 500 otherwise); the error's
class name travels in ``error.type``. Each request runs on a thread of its own.

A body is read by its ``Content-Length`` only: one that is not a number of bytes, or two
that disagree, answer 400; more than :data:`MAX_BODY_BYTES` 413 (unread); a body that ends
early 400, one that stops coming for :data:`READ_TIMEOUT_S` 408; a ``Transfer-Encoding``
411. A body must be JSON nested at most ``MAX_JSON_DEPTH`` deep (``_wire.py``). A malformed
request is never a 5xx.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .._errors import RolloutConfigError, RolloutRequestError, RolloutTypeError
from ..engines._engine import RolloutEngine
from ..engines._types import check_int
from ._http import Answer, JsonHandler, JsonHTTPServer, ServingThread, check_host
from ._wire import (
    completion_body,
    health_body,
    request_from_body,
    update_from_body,
)

__all__ = ["RolloutServer"]


#: host names that bind every interface, which a rollout server never does
class _HTTPServer(JsonHTTPServer):
    def __init__(self, address: tuple[str, int], engine: RolloutEngine) -> None:
        self.engine = engine
        super().__init__(address, _Handler)
        self.model = engine.health().model


_Route = Callable[[_HTTPServer, dict[str, Any]], dict[str, Any]]


def _completions(server: _HTTPServer, body: dict[str, Any]) -> dict[str, Any]:
    where = "POST /v1/completions"
    request, logprobs = request_from_body(body, where)
    model = body.get("model")
    if model is not None and model != server.model:
        raise RolloutRequestError(
            f"{where}: model {model!r} is not served here; {server.model!r} is"
        )
    result = server.engine.generate(request)
    return completion_body(result, len(request.prompt_ids), server.model, logprobs)


def _models(server: _HTTPServer, body: dict[str, Any]) -> dict[str, Any]:
    health = server.engine.health()
    entry = {"id": health.model, "object": "model", "max_model_len": health.context_length}
    return {"object": "list", "data": [entry]}


def _abort(server: _HTTPServer, body: dict[str, Any]) -> dict[str, Any]:
    request_id = body.get("request_id")
    if not isinstance(request_id, str):
        raise RolloutTypeError(f"POST /abort: request_id must be a str, got {request_id!r}")
    return {"request_id": request_id, "aborted": server.engine.abort(request_id)}


def _pause(server: _HTTPServer, body: dict[str, Any]) -> dict[str, Any]:
    server.engine.pause()
    return {"paused": True}


def _resume(server: _HTTPServer, body: dict[str, Any]) -> dict[str, Any]:
    server.engine.resume()
    return {"paused": False}


def _sleep(server: _HTTPServer, body: dict[str, Any]) -> dict[str, Any]:
    server.engine.sleep(check_int(body.get("level", 1), "POST /sleep: level"))
    return {"sleeping": True}


def _wake_up(server: _HTTPServer, body: dict[str, Any]) -> dict[str, Any]:
    server.engine.wake_up()
    return {"sleeping": False}


_ROUTES: dict[tuple[str, str], _Route] = {
    ("POST", "/v1/completions"): _completions,
    ("GET", "/v1/models"): _models,
    ("GET", "/health"): lambda server, body: health_body(server.engine.health()),
    ("POST", "/abort"): _abort,
    ("POST", "/pause"): _pause,
    ("POST", "/resume"): _resume,
    ("GET", "/weights"): lambda server, body: {"weight_version": server.engine.weight_version()},
    ("POST", "/weights"): lambda server, body: {
        "weight_version": server.engine.load_weights(update_from_body(body))
    },
    ("POST", "/sleep"): _sleep,
    ("POST", "/wake_up"): _wake_up,
}
_PATHS = frozenset(path for _, path in _ROUTES)


class _Handler(JsonHandler):
    server: _HTTPServer
    server_version = "sc-rollout"

    def _endpoint(self, method: str, path: str) -> Answer | None:
        route = _ROUTES.get((method, path))
        return None if route is None else functools.partial(route, self.server)

    def _known(self, path: str) -> bool:
        return path in _PATHS


class RolloutServer(ServingThread):
    """Serves ``engine`` over HTTP at ``host:port`` (see the module's endpoints).

    ``host`` defaults to ``SC_ROLLOUT_HOST`` (``127.0.0.1``); addresses of every interface
    (``0.0.0.0``, ``::``) are refused: on a cluster give the node's address. ``port`` 0
    takes a free port. The socket is bound on construction (:attr:`url` is known at once);
    :meth:`start` serves from a daemon thread, :meth:`serve_forever` from the calling
    thread (a server process). ``with RolloutServer(engine) as server:`` starts and stops.
    """

    def __init__(self, engine: RolloutEngine, *, host: str | None = None, port: int = 0) -> None:
        if not isinstance(engine, RolloutEngine):
            raise RolloutTypeError(
                f"RolloutServer(engine=...) takes a RolloutEngine, got {type(engine).__name__}"
            )
        bind = check_host(host, "RolloutServer")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise RolloutConfigError(
                f"RolloutServer: port must be an int in 0..65535, got {port!r}"
            )
        self._engine = engine
        self._model_server = _HTTPServer((bind, port), engine)
        super().__init__(self._model_server, bind, "sc-rollout-server")

    @property
    def engine(self) -> RolloutEngine:
        """The engine served."""
        return self._engine

    def __repr__(self) -> str:
        return f"RolloutServer({self.url}, model={self._model_server.model!r})"
