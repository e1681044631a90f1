"""Malformed HTTP requests to both servers (the rollout server, the chat server) are answered
4xx with a named error, never 500, and never hang a handler: bodies nested too deep, numbers
Python cannot read, malformed or absurd ``Content-Length`` headers, bodies shorter than
announced (closed early, or never sent), chunked bodies, paths that are not paths; and the
server answers a well-formed request afterwards."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from _rollout_helpers import END, TEMPLATE, RawAnswer, exchange, http_request, scripted
from sc_rollout import ChatFront, ChatServer, RolloutServer, SamplingParams
from sc_rollout.serving import _http, _wire
from sc_rollout.testing import ToyEngine, ToyEngineConfig

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class Front:
    """A server under test: where it listens, its main endpoint, a well-formed body for it,
    and a check of the answer to that body."""

    name: str
    host: str
    port: int
    path: str
    good: dict[str, Any]
    answered: Callable[[dict[str, Any]], bool]

    def send(
        self,
        body: bytes,
        *,
        headers: list[tuple[str, str]] | None = None,
        path: str | None = None,
        half_close: bool = True,
    ) -> RawAnswer:
        if headers is None:
            headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        data = http_request("POST", path or self.path, [("Host", "test"), *headers], body)
        return exchange(self.host, self.port, data, half_close=half_close)

    def still_serves(self) -> None:
        answer = self.send(json.dumps(self.good).encode())
        assert answer.status == 200, answer.body[:300]
        assert self.answered(answer.json())


@pytest.fixture(params=["rollout", "chat"])
def front(request: pytest.FixtureRequest) -> Iterator[Front]:
    if request.param == "rollout":
        with RolloutServer(ToyEngine(ToyEngineConfig(context_length=64))) as server:
            yield Front(
                "rollout",
                server.host,
                server.port,
                "/v1/completions",
                {"prompt": [1, 2, 3], "max_tokens": 4, "seed": 0},
                lambda a: len(a["choices"][0]["token_ids"]) == 4,
            )
    else:
        sampling = SamplingParams(max_tokens=50, stop_token_ids=[END])
        front = ChatFront(scripted(lambda prompt: "hello"), TEMPLATE, sampling=sampling)
        with ChatServer(front) as server:
            yield Front(
                "chat",
                server.host,
                server.port,
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}]},
                lambda a: a["choices"][0]["message"]["content"] == "hello",
            )


def _refused(answer: RawAnswer, status: int, *words: str) -> dict[str, Any]:
    assert answer.status == status, answer.body[:300]
    error = answer.json()["error"]
    assert error["code"] == status
    assert error["type"] == "RolloutRequestError"
    for word in words:
        assert word in error["message"]
    return dict(error)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a": ' * 100_000 + b"0" + b"}" * 100_000,
        b'{"prompt": [1], "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    ],
    ids=["arrays", "objects", "in-a-field"],
)
def test_a_body_nested_too_deep_is_a_bad_request(front: Front, body: bytes) -> None:
    _refused(front.send(body), 400, f"POST {front.path}: the body nests", "levels deep")
    front.still_serves()


def test_the_depth_limit_is_exact(front: Front) -> None:
    limit = _wire.MAX_JSON_DEPTH
    # the body is one level, the field's arrays the others
    at = dict(front.good, extra=json.loads("[" * (limit - 1) + "]" * (limit - 1)))
    assert front.send(json.dumps(at).encode()).status == 200
    over = dict(front.good, extra=json.loads("[" * limit + "]" * limit))
    message = f"the body nests {limit + 1} levels deep; at most {limit}"
    _refused(front.send(json.dumps(over).encode()), 400, message)
    # brackets inside strings are text, not nesting
    text = dict(front.good, extra="[{" * 1000, other=['"]]"', "\\[\\"])
    assert front.send(json.dumps(text).encode()).status == 200


def test_a_number_python_cannot_read_is_a_bad_request(front: Front) -> None:
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    if not limit:
        pytest.skip("this Python reads ints of any length")
    body = b'{"max_tokens": ' + b"9" * (limit + 1) + b"}"
    _refused(front.send(body), 400, "the body holds a number Python cannot read", f"({limit}")
    front.still_serves()


@pytest.mark.parametrize(
    ("value", "status", "words"),
    [
        ("-5", 400, "Content-Length must be a number of bytes, got '-5'"),
        ("abc", 400, "Content-Length must be a number of bytes, got 'abc'"),
        ("1e3", 400, "got '1e3'"),
        ("", 400, "got ''"),
        ("9" * 40, 413, "is above the limit of"),
        (str(32 * 1024 * 1024 + 1), 413, "33554433 is above the limit of 33554432 bytes"),
    ],
)
def test_a_malformed_content_length_is_a_bad_request(
    front: Front, value: str, status: int, words: str
) -> None:
    headers = [("Content-Type", "application/json"), ("Content-Length", value)]
    _refused(front.send(b'{"prompt": [1]}', headers=headers), status, f"POST {front.path}", words)
    front.still_serves()


def test_the_body_limit_is_a_module_constant() -> None:
    assert _http.MAX_BODY_BYTES == 32 * 1024 * 1024


def test_conflicting_content_lengths_are_a_bad_request(front: Front) -> None:
    headers = [("Content-Length", "2"), ("Content-Length", "3")]
    _refused(front.send(b"{}", headers=headers), 400, "conflicting Content-Length")
    same = [("Content-Length", "2"), ("Content-Length", "2")]
    assert front.send(b"{}", headers=same).status != 500


def test_a_body_shorter_than_announced_is_a_bad_request(front: Front) -> None:
    headers = [("Content-Length", "100")]
    # the client ends its side after 15 bytes: the server sees the body end there
    answer = front.send(b'{"prompt": [1]}', headers=headers)
    _refused(answer, 400, "the body ended after 15 of the 100 bytes")
    front.still_serves()


def test_a_body_that_never_comes_times_out(front: Front, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_http.JsonHandler, "timeout", 0.5)
    started = time.monotonic()
    # the client keeps its side open and sends nothing more: no hang past the timeout
    answer = front.send(b'{"pro', headers=[("Content-Length", "100")], half_close=False)
    _refused(answer, 408, "the body did not arrive within 0.5 s")
    assert time.monotonic() - started < 5
    front.still_serves()


def test_a_chunked_body_is_refused_with_411(front: Front) -> None:
    body = b"2\r\n{}\r\n0\r\n\r\n"
    headers = [("Transfer-Encoding", "chunked")]
    _refused(front.send(body, headers=headers), 411, "Transfer-Encoding 'chunked'")
    front.still_serves()


def test_a_path_that_is_not_a_path_is_a_bad_request(front: Front) -> None:
    answer = front.send(b"{}", path="http://[nope/v1")  # an unclosed IPv6 address
    _refused(answer, 400, "not a request path")
    front.still_serves()


@pytest.mark.parametrize("session_id", ["\ud800", "é", "a\r\nX-Injected: 1", " padded"])
def test_a_session_id_that_is_no_header_value_is_not_echoed_in_a_header(session_id: str) -> None:
    sampling = SamplingParams(max_tokens=50, stop_token_ids=[END])
    front = ChatFront(scripted(lambda prompt: "hello"), TEMPLATE, sampling=sampling)
    with ChatServer(front) as server:
        chat = Front("chat", server.host, server.port, "/v1/chat/completions", {}, bool)
        for sid, echoed in ((session_id, False), ("plain-1", True)):
            body = {"messages": [{"role": "user", "content": "hi"}], "session_id": sid}
            answer = chat.send(json.dumps(body).encode())
            assert answer.status == 200, answer.body[:300]
            assert answer.json()["sc_session_id"] == sid  # the body carries it in any case
            assert ("x-session-id" in answer.headers) is echoed
            assert "x-injected" not in answer.headers
        assert answer.headers["x-session-id"] == "plain-1"
