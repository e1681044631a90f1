"""A fuzz test of both HTTP fronts: random requests to every endpoint of the rollout server
(on the toy engine) and of the chat server (on the chat tests' scripted engine and character
template): random bytes, random JSON with random types at the endpoint's known fields, deep
nesting, huge numbers, wrong types, with random ``Content-Length``, ``Content-Type`` and
``Transfer-Encoding`` headers. Every answer comes within a socket timeout, is never a 5xx,
is a JSON body (an OpenAI error body naming its status, for a 4xx), and an input known to be
bad gets a 4xx; after the fuzzing the server still answers a well-formed request."""

from __future__ import annotations

import json
import math
import re
import string
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from _rollout_helpers import END, TEMPLATE, RawAnswer, exchange, http_request, scripted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sc_rollout import (
    ChatFront,
    ChatServer,
    GenerateRequest,
    RolloutClient,
    RolloutServer,
    SamplingParams,
    WeightUpdate,
)
from sc_rollout.serving._http import ServingThread
from sc_rollout.serving._wire import MAX_JSON_DEPTH
from sc_rollout.testing import ToyEngine, ToyEngineConfig

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: the most digits of an int Python reads (its JSON parser too; 0: no limit)
INT_DIGITS: int = getattr(sys, "get_int_max_str_digits", lambda: 0)()

#: every endpoint with the fields its body is read for
ROLLOUT_ENDPOINTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("POST", "/v1/completions"): (
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop_token_ids",
        "banned_token_ids",
        "logprobs",
        "return_token_ids",
        "request_id",
        "session_id",
        "n",
        "stream",
        "stop",
        "model",
    ),
    ("GET", "/v1/models"): (),
    ("GET", "/health"): (),
    ("POST", "/abort"): ("request_id",),
    ("POST", "/pause"): (),
    ("POST", "/resume"): (),
    ("GET", "/weights"): (),
    ("POST", "/weights"): ("version", "path"),
    ("POST", "/sleep"): ("level",),
    ("POST", "/wake_up"): (),
}
CHAT_ENDPOINTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("POST", "/v1/chat/completions"): (
        "model",
        "messages",
        "tools",
        "tool_choice",
        "session_id",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop_token_ids",
        "n",
        "stream",
        "stop",
    ),
    ("GET", "/v1/models"): (),
    ("GET", "/health"): (),
}

# --- values ---------------------------------------------------------------------------------

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(10**18, 10**4000),  # beyond any int64, up to what Python's JSON reads
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "\x00", "\ud800", "a\r\nX-Injected: 1", "function", "assistant"]),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_TOKENS = st.lists(st.one_of(st.integers(0, 15), st.integers(-3, 40)), max_size=6)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"])},
    optional={
        "content": st.one_of(
            st.text(max_size=30),
            st.none(),
            st.lists(
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["text", "image"])}, optional={"text": _JSON}
                ),
                max_size=2,
            ),
            _JSON,
        ),
        "tool_call_id": st.one_of(st.text(max_size=8), _JSON),
        "name": _JSON,
        "tool_calls": st.one_of(
            _JSON,
            st.lists(
                st.fixed_dictionaries(
                    {"id": st.one_of(st.text(max_size=8), _JSON)},
                    optional={
                        "type": _JSON,
                        "function": st.one_of(
                            _JSON,
                            st.fixed_dictionaries(
                                {"name": st.one_of(st.text(max_size=8), _JSON)},
                                optional={"arguments": _JSON},
                            ),
                        ),
                    },
                ),
                max_size=2,
            ),
        ),
    },
)
_TOOL = st.one_of(
    _JSON,
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function", "custom"])},
        optional={
            "function": st.one_of(
                _JSON,
                st.fixed_dictionaries(
                    {"name": st.one_of(st.text(max_size=8), _JSON)},
                    optional={"parameters": _JSON, "description": _JSON},
                ),
            )
        },
    ),
)
#: a conversation and a tool of the right shape, to get past the first checks
_GOOD_MESSAGES = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "assistant"]),
            "content": st.text(max_size=30),
        }
    ),
    min_size=1,
    max_size=3,
)
_GOOD_TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.text(min_size=1, max_size=8)},
            optional={"parameters": st.just({"type": "object"}), "description": st.text()},
        ),
    }
)


def _mostly(good: st.SearchStrategy[Any], edge: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` three times in four, else ``edge``."""
    return st.one_of(good, good, good, edge)


#: values of the right shape, mostly valid, with their edges, for the fields that have one
_PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "prompt": _mostly(st.lists(st.integers(0, 15), min_size=1, max_size=6), _TOKENS),
    "stop_token_ids": _mostly(st.lists(st.integers(0, 15), max_size=3), _TOKENS),
    "banned_token_ids": _mostly(st.lists(st.integers(0, 15), max_size=3), _TOKENS),
    "max_tokens": _mostly(st.integers(1, 40), st.integers(-2, 100)),
    "max_completion_tokens": _mostly(st.integers(1, 40), st.integers(-2, 100)),
    "temperature": _mostly(st.floats(0, 3), st.floats(-1, 0)),
    "top_p": _mostly(st.floats(0.01, 1), st.floats(-0.5, 1.5)),
    "seed": _mostly(st.integers(0, 5), st.integers()),
    "logprobs": _mostly(st.sampled_from([0, None]), st.integers(-1, 2)),
    "return_token_ids": st.booleans(),
    "n": _mostly(st.sampled_from([1, None]), st.integers(0, 2)),
    "stream": _mostly(st.sampled_from([False, None]), st.just(True)),
    "stop": _mostly(st.sampled_from([None, []]), st.sampled_from(["", "x", ["x"]])),
    "request_id": st.text(max_size=8),
    "session_id": _mostly(
        st.text(min_size=1, max_size=8), st.sampled_from(["", "\ud800", "é", "a\r\nX-Injected: 1"])
    ),
    "level": _mostly(st.sampled_from([1, 2]), st.integers(-1, 3)),
    "version": _mostly(st.integers(0, 50), st.integers(-1, 10**30)),
    # a relative path without "..": under the test's working directory, never the disk's
    "path": _mostly(
        st.none(),
        st.text(string.ascii_letters + "./\x00\ud800é", max_size=12).filter(
            lambda p: ".." not in p and not p.startswith("/") and p.strip(".") != ""
        ),
    ),
    "messages": _mostly(_GOOD_MESSAGES, st.lists(_MESSAGE, max_size=3)),
    "tools": _mostly(st.lists(_GOOD_TOOL, max_size=2), st.lists(_TOOL, max_size=2)),
    "tool_choice": st.sampled_from(["none", "auto", "required"]),
    "model": _mostly(st.sampled_from(["sc-toy", "scripted", None]), st.just("gpt")),
}


def _field_value(name: str) -> st.SearchStrategy[Any]:
    plausible = _PLAUSIBLE.get(name)
    return _JSON if plausible is None else st.one_of(plausible, _JSON)


def _fields(names: tuple[str, ...], plausible: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Bodies of the endpoint's fields: of the right shape (``plausible``, with the
    essential ones always there), or of any type."""
    if plausible:
        required = {n: _PLAUSIBLE[n] for n in ("prompt", "messages") if n in names}
        optional = {n: _PLAUSIBLE.get(n, _JSON) for n in names if n not in required}
        return st.fixed_dictionaries(required, optional=optional)
    return st.fixed_dictionaries({}, optional={n: _field_value(n) for n in names}).flatmap(
        lambda known: st.dictionaries(st.text(max_size=8), _JSON, max_size=2).map(
            lambda extra: {**extra, **known}
        )
    )


# --- bodies ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    """A request body, and whether it is known to be bad (it must get a 4xx)."""

    data: bytes
    bad: bool
    kind: str


def _encode(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8")


def _nested(depth: int, kind: str) -> bytes:
    if kind == "arrays":
        return b"[" * depth + b"]" * depth
    if kind == "objects":
        return b'{"a": ' * depth + b"1" + b"}" * depth
    return b'{"prompt": [1], "messages": ' + b"[" * depth + b"]" * depth + b"}"


def _bodies(names: tuple[str, ...]) -> st.SearchStrategy[Body]:
    fields = _fields(names, plausible=False)
    return st.one_of(
        _fields(names, plausible=True).map(lambda v: Body(_encode(v), False, "plausible")),
        _fields(names, plausible=True).map(lambda v: Body(_encode(v), False, "plausible")),
        fields.map(lambda v: Body(_encode(v), False, "fields")),
        st.binary(max_size=300).map(lambda b: Body(b, _not_a_json_object(b), "bytes")),
        _JSON.map(lambda v: Body(_encode(v), not isinstance(v, dict), "json")),
        fields.map(_encode).map(lambda data: Body(data[: len(data) // 2], True, "cut")),
        st.builds(
            lambda depth, kind: Body(_nested(depth, kind), True, f"nested {kind}"),
            st.sampled_from([MAX_JSON_DEPTH + 1, MAX_JSON_DEPTH + 2, 1_000, 10_000, 200_000]),
            st.sampled_from(["arrays", "objects", "field"]),
        ),
        st.builds(
            lambda name, digits: Body(_with(name, b"9" * digits), 0 < INT_DIGITS < digits, "int"),
            st.sampled_from([*names, "x"]),
            st.sampled_from([19, 20, 400, 4300, 4301, 50_000]),
        ),
        st.builds(
            lambda name, number: Body(_with(name, number), False, "number"),
            st.sampled_from([*names, "x"]),
            st.sampled_from([b"1e999", b"-1e999", b"NaN", b"Infinity", b"-0", b"1e-400", b"0.5"]),
        ),
    )


def _with(name: str, value: bytes) -> bytes:
    """A well-formed body (for either server) whose field ``name`` is ``value``, as is."""
    base = {"prompt": [1], "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    base.pop(name, None)
    return _encode(base)[:-1] + b', "' + name.encode() + b'": ' + value + b"}"


def _not_a_json_object(data: bytes) -> bool:
    if not data.strip(b" \t\n\r"):
        return False  # a body of JSON's whitespace is no body: {}
    try:
        return not isinstance(json.loads(data.decode("utf-8")), dict)
    except (ValueError, RecursionError):
        return True


# --- headers --------------------------------------------------------------------------------

#: header values the request line can carry: latin-1 text without line breaks
_HEADER_TEXT = st.text(
    st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\r\n\x7f"),
    max_size=24,
)


@dataclass(frozen=True)
class Headers:
    """The headers of a request; whether they alone make it bad; whether the server reads
    exactly the body sent (only then does a bad body make the request bad)."""

    pairs: tuple[tuple[str, str], ...]
    bad: bool
    whole: bool


def _length_verdict(value: str, size: int) -> tuple[bool, bool]:
    """(bad, whole) for a ``Content-Length`` of ``value`` on a body of ``size`` bytes."""
    text = value.strip(" \t")
    if re.fullmatch("[0-9]+", text) is None:
        return True, False
    length = int(text)
    return length > size, length == size  # more than sent: the body ends short


@st.composite
def _headers(draw: st.DrawFn, size: int) -> Headers:
    pairs: list[tuple[str, str]] = [("Host", "fuzz")]
    kind = draw(st.sampled_from(["right"] * 10 + ["none", "number", "text", "huge", "twice"]))
    if kind == "none":
        bad, whole = False, size == 0
    elif kind == "twice":
        other = draw(st.integers(0, size + 5))
        pairs += [("Content-Length", str(size)), ("Content-Length", str(other))]
        bad, whole = other != size, other == size
    else:
        value = {
            "right": st.just(str(size)),
            "number": st.integers(-(10**6), size + 100).map(str),
            "text": _HEADER_TEXT,
            "huge": st.integers(32 * 2**20 + 1, 10**40).map(str),
        }[kind]
        length = draw(value)
        pairs.append(("Content-Length", length))
        bad, whole = _length_verdict(length, size)
    content_type = draw(
        st.one_of(
            st.sampled_from(["application/json", "text/plain", "multipart/form-data", ""]),
            _HEADER_TEXT,
            st.none(),
        )
    )
    if content_type is not None:
        pairs.append(("Content-Type", content_type))
    encoding = draw(st.sampled_from([None] * 17 + ["chunked", "gzip", ""]))
    if encoding is not None:
        pairs.append(("Transfer-Encoding", encoding))
        bad = True  # refused (411): bodies come with a Content-Length
    if draw(st.booleans()):
        pairs.append(("X-Session-Id", draw(_HEADER_TEXT)))
    return Headers(tuple(pairs), bad, whole)


# --- the servers ----------------------------------------------------------------------------


def _check(answer: RawAnswer, must_refuse: bool, what: str) -> None:
    assert answer.status < 500, f"{what}: {answer.status} {answer.body[:400]!r}"
    assert answer.status in (200, 400, 404, 405, 408, 409, 411, 413, 422), what
    length = answer.headers.get("content-length")
    assert length is not None, what
    assert int(length) == len(answer.body), what
    body = answer.json()  # every answer is a JSON object
    assert isinstance(body, dict), what
    if answer.status == 200:
        assert "error" not in body, what
        assert not must_refuse, f"{what}: a bad request answered 200: {answer.body[:300]!r}"
    else:
        assert body["error"]["code"] == answer.status, what
        assert isinstance(body["error"]["message"], str), what
        assert body["error"]["message"], what


def _fuzz(server: ServingThread, method: str, path: str, names: tuple[str, ...]) -> None:
    """Send the fuzzed requests of one endpoint, one connection each."""

    @FUZZ
    @given(body=_bodies(names), data=st.data())
    def fuzz(body: Body, data: st.DataObject) -> None:
        headers = data.draw(_headers(len(body.data)))
        target = path + data.draw(st.sampled_from([""] * 7 + ["?a=1&b", "#x", "/"]))
        request = http_request(method, target, headers.pairs, body.data)
        what = f"{method} {target} with {headers.pairs!r:.300} and {body.kind} {body.data!r:.300}"
        answer = exchange(server.host, server.port, request, timeout_s=20.0)
        _check(answer, headers.bad or (headers.whole and body.bad), what)
        if isinstance(server, RolloutServer):  # undo a well-formed pause or sleep
            server.engine.resume()
            if server.engine.health().sleeping:
                server.engine.wake_up()

    fuzz()


def _ids(endpoints: dict[tuple[str, str], tuple[str, ...]]) -> list[str]:
    return [method + path.replace("/", "-") for method, path in endpoints]


@pytest.fixture(scope="module")
def rollout_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutServer]:
    """A toy server, run in an empty directory: the weight paths the fuzzing names are
    relative, so they name nothing (or that directory)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("weights"))
        with RolloutServer(ToyEngine(ToyEngineConfig(context_length=96))) as server:
            yield server


@pytest.fixture(scope="module")
def chat_server() -> Iterator[ChatServer]:
    sampling = SamplingParams(max_tokens=40, stop_token_ids=[END])
    with ChatServer(ChatFront(scripted(lambda prompt: "fine"), TEMPLATE, sampling=sampling)) as s:
        yield s


@pytest.mark.parametrize(("method", "path"), list(ROLLOUT_ENDPOINTS), ids=_ids(ROLLOUT_ENDPOINTS))
def test_the_rollout_server_answers_fuzzed_requests_without_a_5xx(
    rollout_server: RolloutServer, method: str, path: str
) -> None:
    _fuzz(rollout_server, method, path, ROLLOUT_ENDPOINTS[method, path])
    # still serving, and correctly: the tokens of the engine in-process at the same weights
    client = RolloutClient(rollout_server.url)
    update = WeightUpdate(client.weight_version())  # the same version again: reloaded
    client.load_weights(update)
    request = GenerateRequest([1, 2, 3], SamplingParams(max_tokens=5, seed=0))
    result = client.generate(request)
    expected = ToyEngine(ToyEngineConfig(context_length=96))
    expected.load_weights(update)
    assert result.token_ids == expected.generate(request).token_ids
    assert len(result.token_ids) == 5
    assert all(math.isfinite(x) for x in result.logprobs)


@pytest.mark.parametrize(("method", "path"), list(CHAT_ENDPOINTS), ids=_ids(CHAT_ENDPOINTS))
def test_the_chat_server_answers_fuzzed_requests_without_a_5xx(
    chat_server: ChatServer, method: str, path: str
) -> None:
    _fuzz(chat_server, method, path, CHAT_ENDPOINTS[method, path])
    # still serving, and correctly: a new conversation answered and recorded
    content = f"after fuzzing {method} {path}"
    data = _encode({"model": "scripted", "messages": [{"role": "user", "content": content}]})
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    request = http_request("POST", "/v1/chat/completions", headers, data)
    answer = exchange(chat_server.host, chat_server.port, request)
    assert answer.status == 200, answer.body[:300]
    reply = answer.json()
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "fine"}
    recorded = chat_server.front.session(reply["sc_session_id"])
    assert recorded.to_dict()["response_ids"] == [*TEMPLATE.encode("fine"), END]
