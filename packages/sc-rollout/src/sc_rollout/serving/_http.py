"""The JSON-over-HTTP plumbing every sc-rollout server shares (the rollout server and the
chat server): the host check, :class:`JsonHTTPServer` and :class:`JsonHandler` (a request's
body read by its ``Content-Length`` only and answered with OpenAI's error body on failure, see
``_server.py``), and :class:`ServingThread` (bind, start, serve, stop).
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import urlsplit

from .._errors import RolloutConfigError, RolloutRequestError, RolloutTypeError, ScRolloutError
from .._settings import HOST
from ._wire import (
    decode_body,
    error_body,
    error_status,
)

__all__ = [
    "LINGER_S",
    "MAX_BODY_BYTES",
    "READ_TIMEOUT_S",
    "Answer",
    "JsonHTTPServer",
    "JsonHandler",
    "ServingThread",
    "check_host",
    "server_url",
]

_log = logging.getLogger("sc_rollout.server")


_ALL_INTERFACES = frozenset({"", "0.0.0.0", "::", "[::]", "*"})

#: the largest request body a server reads (32 MiB: a prompt of a million token ids fits
#: several times); a larger ``Content-Length`` is answered 413 without reading the body
MAX_BODY_BYTES = 32 * 1024 * 1024
#: seconds a server waits for the next bytes of a request (a body that stops coming is
#: answered 408) or for a client to take its answer (``JsonHandler.timeout``)
READ_TIMEOUT_S = 30.0
#: seconds a server keeps reading (and dropping) what a client still sends after the answer,
#: before it closes the connection
LINGER_S = 2.0

_DIGITS = re.compile("[0-9]+")


def check_host(host: str | None, where: str) -> str:
    """The address to bind: ``host``, else ``SC_ROLLOUT_HOST`` (default ``127.0.0.1``);
    every-interface addresses are a :class:`RolloutConfigError`."""
    chosen = HOST.get() if host is None else host
    if not isinstance(chosen, str):
        raise RolloutTypeError(f"{where}: host must be a str, got {chosen!r}")
    if chosen.strip() in _ALL_INTERFACES:
        raise RolloutConfigError(
            f"{where}: host {chosen!r} binds every interface; give the node's address "
            "(or 127.0.0.1)"
        )
    return chosen.strip()


def server_url(host: str, port: int) -> str:
    """``http://host:port`` (IPv6 addresses in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


#: an endpoint's answer to a request body
Answer = Callable[[dict[str, Any]], dict[str, Any]]


class JsonHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server of JSON endpoints (a :class:`JsonHandler` subclass answers),
    bound to ``address`` (IPv4 or IPv6)."""

    daemon_threads = True
    block_on_close = False
    #: the listen backlog: a batch's requests connect all at once (socketserver's default of
    #: 5 made a burst of 32 wait out the kernel's SYN retries, or be reset)
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], handler: type[JsonHandler]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, handler)


class _BodyError(RolloutRequestError):
    """A request whose body cannot be read: a malformed or conflicting ``Content-Length``
    (400), a body too large (413), one that ended early (400) or did not come in time (408),
    a transfer coding (411). It answers with its own ``status``, as a
    :class:`~sc_rollout.RolloutRequestError`."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class JsonHandler(BaseHTTPRequestHandler):
    """Answers JSON requests: a subclass says which ``(method, path)`` it serves
    (:meth:`_endpoint`) and which paths exist under another method (:meth:`_known`);
    errors go out as OpenAI's error body, an sc-rollout error with its status, any other
    as 500.

    The body is read by its ``Content-Length`` only (at most :data:`MAX_BODY_BYTES`; a
    transfer coding is refused), each read waiting at most :attr:`timeout` seconds; the
    body is JSON nested at most ``MAX_JSON_DEPTH`` deep (see ``_wire.py``). Every such
    refusal is a 4xx."""

    #: where requests and failures are logged
    logger = _log
    #: seconds a connection may wait for the next bytes of its request (its head, its body)
    #: or for the client to take the answer: a body that stops coming is answered 408, a
    #: head that does (or an idle connection) closed
    timeout = READ_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        # headers and body leave in separate writes: without this, Nagle's algorithm and the
        # peer's delayed ACK hold the body back
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def finish(self) -> None:
        super().finish()
        self._linger()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def log_message(self, format: str, *args: Any) -> None:
        self.logger.debug("%s %s", self.address_string(), format % args)

    def _route_path(self) -> str:
        """The request's path as the endpoints are named."""
        return urlsplit(self.path).path

    def _endpoint(self, method: str, path: str) -> Answer | None:
        """The answer of a body at ``method path`` (``None``: no such endpoint)."""
        raise NotImplementedError

    def _known(self, path: str) -> bool:
        """Whether ``path`` is an endpoint under some method (405 rather than 404)."""
        raise NotImplementedError

    def _extra_headers(self, body: dict[str, Any]) -> dict[str, str]:
        """Headers an answer carries besides the content's (one whose value is not plain
        printable ASCII is left out)."""
        return {}

    def _dispatch(self, method: str) -> None:
        try:
            path = self._route_path()
        except ValueError as exc:  # urlsplit: "http://[x/" holds an unclosed IPv6 address
            message = f"{method} {self.path!r:.80}: not a request path ({exc})"
            self._send(400, error_body("RolloutRequestError", message, 400))
            return
        where = f"{method} {path}"
        answer_of = self._endpoint(method, path)
        if answer_of is None:
            status = 405 if self._known(path) else 404
            kind = "MethodNotAllowed" if status == 405 else "NotFound"
            self._send(status, error_body(kind, f"{where}: no such endpoint", status))
            return
        try:
            body = decode_body(self._read_body(where), where)
            answer = answer_of(body)
        except _BodyError as exc:
            self._send(exc.status, error_body("RolloutRequestError", str(exc), exc.status))
        except ScRolloutError as exc:
            status = error_status(exc)
            self._send(status, error_body(type(exc).__name__, str(exc), status))
        except Exception as exc:
            self.logger.exception("%s failed", where)
            message = f"{where}: {type(exc).__name__}: {exc}"
            self._send(500, error_body("InternalServerError", message, 500))
        else:
            self._send(200, answer)

    def _read_body(self, where: str) -> bytes:
        """The request's body, as its ``Content-Length`` says (none: empty); a
        :class:`_BodyError` when it cannot be read."""
        encoding = self.headers.get("Transfer-Encoding")
        if encoding is not None:
            raise _BodyError(
                f"{where}: Transfer-Encoding {encoding!r:.40} is not supported; send the body "
                "with a Content-Length",
                411,
            )
        values = [v.strip(" \t") for v in self.headers.get_all("Content-Length") or []]
        if not values:
            return b""
        if len(set(values)) > 1:
            raise _BodyError(
                f"{where}: conflicting Content-Length headers: {', '.join(values)!r:.80}", 400
            )
        text = values[0]
        if _DIGITS.fullmatch(text) is None:
            raise _BodyError(
                f"{where}: Content-Length must be a number of bytes, got {text!r:.40}", 400
            )
        digits = text.lstrip("0") or "0"
        if len(digits) > len(str(MAX_BODY_BYTES)) or int(digits) > MAX_BODY_BYTES:
            raise _BodyError(
                f"{where}: Content-Length {digits:.40} is above the limit of {MAX_BODY_BYTES} "
                "bytes",
                413,
            )
        length = int(digits)
        try:
            raw = self.rfile.read(length)
        except TimeoutError:
            raise _BodyError(
                f"{where}: the body did not arrive within {self.timeout} s (Content-Length "
                f"{length})",
                408,
            ) from None
        except OSError as exc:  # the client went away: the answer will not reach it either
            raise _BodyError(f"{where}: the body could not be read: {exc}", 400) from None
        if len(raw) < length:
            raise _BodyError(
                f"{where}: the body ended after {len(raw)} of the {length} bytes its "
                "Content-Length announces",
                400,
            )
        return raw

    def _send(self, status: int, body: dict[str, Any]) -> None:
        try:
            data = json.dumps(body).encode("utf-8")
            headers = {
                name: value
                for name, value in self._extra_headers(body).items()
                if value.isascii() and value.isprintable() and value == value.strip()
            }
        except Exception as exc:  # an answer that is no JSON: the endpoint's fault
            self.logger.exception("%s: the answer could not be encoded", self.path)
            status, headers = 500, {}
            message = f"{self.command} {self.path}: the answer could not be encoded: {exc!r:.200}"
            data = json.dumps(error_body("InternalServerError", message, 500)).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError as exc:  # the client went away (a router that gave up on us)
            self.logger.debug("%s: the answer could not be sent: %s", self.path, exc)

    def _linger(self) -> None:
        """Before the connection closes, read and drop what the client still sends (a body
        not read: refused, or longer than its Content-Length), for at most
        :data:`LINGER_S` seconds and :data:`MAX_BODY_BYTES` bytes: closing a socket with
        unread input resets the connection, and the client could lose the answer."""
        sock = self.connection
        deadline = time.monotonic() + LINGER_S
        left = MAX_BODY_BYTES
        try:
            sock.shutdown(socket.SHUT_WR)  # the answer is complete: the client sees its end
            while left > 0:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    break
                sock.settimeout(wait)
                chunk = sock.recv(min(left, 65536))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:  # reset, timed out, already closed: nothing more to wait for
            pass


_S = TypeVar("_S", bound="ServingThread")


class ServingThread:
    """What every sc-rollout HTTP server shares: the socket bound on construction (by the
    subclass, as ``httpd``), :meth:`start` from a daemon thread, :meth:`serve_forever` from
    the calling thread, :meth:`stop`, and ``with`` (start, then stop)."""

    def __init__(self, httpd: ThreadingHTTPServer, host: str, thread_name: str) -> None:
        self._httpd = httpd
        self._host = host
        self._port = int(httpd.server_address[1])
        self._thread_name = f"{thread_name}-{self._port}"
        self._thread: threading.Thread | None = None
        self._serving = threading.Event()
        self._closed = False

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """The bound port (the free one chosen for port 0)."""
        return self._port

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return server_url(self._host, self._port)

    def start(self: _S) -> _S:
        """Serve from a daemon thread; returns the server."""
        if self._closed:
            raise RolloutConfigError(f"{type(self).__name__} {self.url}: start() after stop()")
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.serve_forever, name=self._thread_name, daemon=True
            )
            self._thread.start()
            self._serving.wait()
        return self

    def serve_forever(self) -> None:
        """Serve from this thread until :meth:`stop` (from another thread)."""
        self._serving.set()
        self._httpd.serve_forever(poll_interval=0.1)

    def stop(self) -> None:
        """Stop serving and close the socket (requests being answered still finish)."""
        if self._closed:
            return
        self._closed = True
        if self._serving.is_set():
            self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
