"""``RolloutClient``: a rollout server seen as a rollout engine, over HTTP.

One connection per call (the standard library's ``http.client``). A server that cannot be
reached, or that closes the connection before it answers, is a
:class:`ServerUnavailableError`; no answer within the deadline a :class:`RolloutTimeoutError`;
an error answer the same typed exception the engine raised, its message naming the server.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

from .._errors import (
    RolloutConfigError,
    RolloutServerError,
    RolloutTimeoutError,
    RolloutTypeError,
    ScRolloutError,
    ServerUnavailableError,
)
from .._settings import HEALTH_TIMEOUT, REQUEST_TIMEOUT
from ..engines._types import EngineHealth, GenerateRequest, GenerateResult, WeightUpdate
from ._wire import (
    ERROR_CLASSES,
    decode_body,
    health_from_body,
    request_body,
    result_from_body,
    update_body,
)

__all__ = ["RolloutClient", "check_timeout"]


def check_timeout(value: float | None, default: float, where: str) -> float:
    """``value`` (a finite number of seconds > 0), or ``default`` when ``None``."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RolloutTypeError(f"{where} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise RolloutConfigError(f"{where} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


class RolloutClient:
    """The engine served at ``url`` (``http://host:port``), as a
    :class:`~sc_rollout.RolloutEngine`: every method is one HTTP call.

    ``timeout_s`` bounds :meth:`generate` and :meth:`load_weights` (default
    ``SC_ROLLOUT_REQUEST_TIMEOUT_S``), ``health_timeout_s`` every other call (default
    ``SC_ROLLOUT_HEALTH_TIMEOUT_S``). Thread-safe.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float | None = None,
        health_timeout_s: float | None = None,
    ) -> None:
        if not isinstance(url, str):
            raise RolloutTypeError(f"RolloutClient(url=...) must be a str, got {url!r}")
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "http" or not parts.hostname or port is None:
            raise RolloutConfigError(f"RolloutClient: url must be http://host:port, got {url!r}")
        self._url = url.rstrip("/")
        self._host = parts.hostname
        self._port = port
        self._timeout = check_timeout(timeout_s, REQUEST_TIMEOUT.get(), "RolloutClient timeout_s")
        self._control_timeout = check_timeout(
            health_timeout_s, HEALTH_TIMEOUT.get(), "RolloutClient health_timeout_s"
        )
        self._lock = threading.Lock()
        #: open connections, and whether close_connections() cut them
        self._open: dict[http.client.HTTPConnection, bool] = {}

    @property
    def url(self) -> str:
        return self._url

    def __repr__(self) -> str:
        return f"RolloutClient({self._url!r})"

    # --- the engine contract ----------------------------------------------------------------

    def generate(self, request: GenerateRequest) -> GenerateResult:
        """``POST /v1/completions`` of ``request``; the result names this server's URL."""
        if not isinstance(request, GenerateRequest):
            raise RolloutTypeError(
                f"RolloutClient.generate() takes a GenerateRequest, got {type(request).__name__}"
            )
        answer = self._call("POST", "/v1/completions", request_body(request), self._timeout)
        return result_from_body(answer, self._url)

    def abort(self, request_id: str) -> bool:
        answer = self._call("POST", "/abort", {"request_id": request_id}, self._control_timeout)
        return bool(self._field(answer, "aborted", bool, "POST /abort"))

    def pause(self) -> None:
        self._call("POST", "/pause", {}, self._control_timeout)

    def resume(self) -> None:
        self._call("POST", "/resume", {}, self._control_timeout)

    def load_weights(self, update: WeightUpdate) -> int:
        if not isinstance(update, WeightUpdate):
            raise RolloutTypeError(
                f"RolloutClient.load_weights() takes a WeightUpdate, got {type(update).__name__}"
            )
        answer = self._call("POST", "/weights", update_body(update), self._timeout)
        return int(self._field(answer, "weight_version", int, "POST /weights"))

    def weight_version(self) -> int:
        answer = self._call("GET", "/weights", None, self._control_timeout)
        return int(self._field(answer, "weight_version", int, "GET /weights"))

    def health(self) -> EngineHealth:
        return health_from_body(
            self._call("GET", "/health", None, self._control_timeout), self._url
        )

    def sleep(self, level: int = 1) -> None:
        self._call("POST", "/sleep", {"level": level}, self._control_timeout)

    def wake_up(self) -> None:
        self._call("POST", "/wake_up", {}, self._control_timeout)

    # --- connections ------------------------------------------------------------------------

    def close_connections(self) -> int:
        """Cut every call in progress: each fails with :class:`ServerUnavailableError` (a
        router does this to a server it found dead). Returns how many were cut."""
        with self._lock:
            for conn in self._open:
                self._open[conn] = True
                if conn.sock is not None:
                    with contextlib.suppress(OSError):  # already closed
                        conn.sock.shutdown(socket.SHUT_RDWR)
            return len(self._open)

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float
    ) -> dict[str, Any]:
        where = f"{method} {self._url}{path}"
        conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        with self._lock:
            self._open[conn] = False
        try:
            conn.connect()
            with self._lock:
                cut = self._open[conn]
            if cut:
                raise ConnectionAbortedError("the connection was cut by close_connections()")
            data = None if body is None else json.dumps(body).encode("utf-8")
            headers = {} if data is None else {"Content-Type": "application/json"}
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
            status = response.status
        except TimeoutError:
            raise RolloutTimeoutError(f"{where}: no answer within {timeout:g} s") from None
        except (http.client.HTTPException, OSError) as exc:
            raise ServerUnavailableError(f"{where}: {type(exc).__name__}: {exc}") from None
        finally:
            with self._lock:
                del self._open[conn]
            conn.close()
        try:
            answer = decode_body(raw, where)
        except ScRolloutError:
            raise RolloutServerError(
                f"{where}: answered {status} with a body that is not a JSON object: {raw[:200]!r}"
            ) from None
        if status != 200:
            raise _error(where, status, answer)
        return answer

    def _field(self, answer: dict[str, Any], key: str, kind: type, where: str) -> Any:
        value = answer.get(key)
        if not isinstance(value, kind):
            raise RolloutServerError(
                f"{where} at {self._url}: the answer has no {kind.__name__} {key!r}: {answer!r}"
            )
        return value


def _error(where: str, status: int, answer: dict[str, Any]) -> ScRolloutError:
    """The exception of an error answer: the class the server named, else
    :class:`RolloutServerError`."""
    error = answer.get("error")
    kind = error.get("type") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    cls = ERROR_CLASSES.get(kind) if isinstance(kind, str) else None
    if cls is not None:
        return cls(f"{message} (from {where}, status {status})")
    return RolloutServerError(f"{where}: status {status}: {kind}: {message or answer!r}")
