"""The HTTP server and its client: an engine behind OpenAI's completions endpoint gives the
same results as in-process, every control endpoint works, every error comes back typed and
named, the server binds only where it is told, and runs in a process of its own."""

from __future__ import annotations

import http.client
import json
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _rollout_helpers import request, toy_servers, wait_until
from sc_rollout import (
    GenerateRequest,
    GenerateResult,
    RolloutClient,
    RolloutEngine,
    RolloutServer,
    ScRolloutError,
    ServerProcess,
    WeightUpdate,
)
from sc_rollout.errors import (
    PromptTooLongError,
    RolloutConfigError,
    RolloutServerError,
    RolloutTimeoutError,
    RolloutTypeError,
    ServerUnavailableError,
    WeightVersionError,
)
from sc_rollout.serving._wire import ERROR_CLASSES
from sc_rollout.testing import ToyEngine, ToyEngineConfig

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def server() -> Iterator[RolloutServer]:
    with toy_servers(ToyEngineConfig(context_length=32)) as (one,):
        yield one


def _raw(server: RolloutServer, method: str, path: str, body: object = None) -> tuple[int, Any]:
    """One plain HTTP call, as any OpenAI client would make it."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body))
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_client_is_an_engine_with_the_servers_results(server: RolloutServer) -> None:
    client = RolloutClient(server.url)
    assert isinstance(client, RolloutEngine)
    req = request(max_tokens=6, seed=11)
    remote = client.generate(req)
    local = ToyEngine(ToyEngineConfig(context_length=32)).generate(req)
    assert remote == GenerateResult(**{**local.__dict__, "server": server.url})
    health = client.health()
    assert (health.model, health.context_length, health.weight_version) == ("sc-toy", 32, 0)
    assert client.load_weights(WeightUpdate(2)) == 2 == client.weight_version()
    assert client.generate(req).weight_version == 2
    client.pause()
    assert client.health().paused
    client.resume()
    client.sleep(2)
    assert client.health().sleeping
    client.wake_up()
    assert not client.abort("nothing")


def test_a_burst_of_connections_is_queued_not_reset(server: RolloutServer) -> None:
    """A whole batch connects at once (the trainer's rollout sends every row together): the
    listen backlog takes them all, where socketserver's default of 5 reset some."""
    client = RolloutClient(server.url)
    start = threading.Barrier(128)
    results: list[GenerateResult] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        start.wait()
        try:
            results.append(client.generate(request(max_tokens=2, seed=i)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(128)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(results) == 128


def test_the_completions_endpoint_speaks_openai_with_token_ids(server: RolloutServer) -> None:
    body = {"model": "sc-toy", "prompt": [1, 2], "max_tokens": 3, "logprobs": 0, "seed": 4}
    status, answer = _raw(server, "POST", "/v1/completions", body)
    assert status == 200
    assert answer["object"] == "text_completion"
    assert answer["model"] == "sc-toy"
    choice = answer["choices"][0]
    assert len(choice["token_ids"]) == 3
    assert len(choice["logprobs"]["token_logprobs"]) == 3
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert choice["finish_reason"] == "length"
    assert answer["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert answer["weight_version"] == answer["min_weight_version"] == 0
    # without logprobs, none are sent; null fields take their defaults
    status, plain = _raw(server, "POST", "/v1/completions", {"prompt": [1], "max_tokens": None})
    assert status == 200
    assert plain["choices"][0]["logprobs"] is None
    assert len(plain["choices"][0]["token_ids"]) == 16
    status, models = _raw(server, "GET", "/v1/models")
    assert models["data"] == [{"id": "sc-toy", "object": "model", "max_model_len": 32}]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "kind", "words"),
    [
        ("POST", "/v1/completions", {"prompt": "hello"}, 400, "RolloutRequestError", "no tokeni"),
        ("POST", "/v1/completions", {"prompt": [[1], [2]]}, 400, "RolloutRequestError", "batch"),
        ("POST", "/v1/completions", {}, 400, "RolloutRequestError", "'prompt' (a list of token"),
        ("POST", "/v1/completions", {"prompt": [1], "n": 2}, 400, "RolloutRequestError", "n must"),
        (
            "POST",
            "/v1/completions",
            {"prompt": [1], "stream": True},
            400,
            "RolloutRequestError",
            "",
        ),
        ("POST", "/v1/completions", {"prompt": [1], "stop": ["x"]}, 400, "RolloutRequestError", ""),
        (
            "POST",
            "/v1/completions",
            {"prompt": [1], "max_tokens": "5"},
            400,
            "RolloutTypeError",
            "",
        ),
        (
            "POST",
            "/v1/completions",
            {"prompt": [1], "logprobs": -1},
            400,
            "RolloutRequestError",
            "",
        ),
        ("POST", "/v1/completions", {"prompt": [1] * 30}, 400, "PromptTooLongError", "30 tokens"),
        ("POST", "/v1/completions", {"prompt": [99]}, 400, "RolloutRequestError", "token id 99"),
        (
            "POST",
            "/v1/completions",
            {"prompt": [1], "model": "gpt"},
            400,
            "RolloutRequestError",
            "",
        ),
        ("POST", "/v1/completions", [1, 2], 400, "RolloutTypeError", "must be a JSON object"),
        ("POST", "/v1/completions", b"{nope", 400, "RolloutRequestError", "not valid JSON"),
        ("POST", "/pause", b"\x1c", 400, "RolloutRequestError", "not valid JSON"),  # no space
        ("POST", "/pause", b"\xff", 400, "RolloutRequestError", "not valid JSON: 'utf-8'"),
        ("POST", "/weights", {"version": "3"}, 400, "RolloutTypeError", "got '3' (str)"),
        ("POST", "/weights", {"version": 1.5}, 400, "RolloutTypeError", "got 1.5 (float)"),
        ("POST", "/weights", {"path": "/w"}, 400, "RolloutTypeError", "got None"),
        ("POST", "/weights", {"version": -1}, 409, "WeightVersionError", ">= 0, got -1"),
        ("POST", "/weights", {"version": 1, "path": "/no/such"}, 422, "WeightLoadError", "/no/su"),
        ("POST", "/abort", {"request_id": 5}, 400, "RolloutTypeError", "request_id must be a str"),
        ("POST", "/sleep", {"level": "deep"}, 400, "RolloutTypeError", "level must be an int"),
        ("GET", "/nowhere", None, 404, "NotFound", "GET /nowhere: no such endpoint"),
        ("GET", "/v1/completions", None, 405, "MethodNotAllowed", "no such endpoint"),
    ],
)
def test_bad_input_gets_a_status_and_a_named_error(
    server: RolloutServer,
    method: str,
    path: str,
    body: object,
    status: int,
    kind: str,
    words: str,
) -> None:
    got, answer = _raw(server, method, path, body)
    assert got == status
    assert answer["error"]["type"] == kind
    assert answer["error"]["code"] == status
    assert words in answer["error"]["message"]
    assert RolloutClient(server.url).health().in_flight == 0


def test_the_client_raises_the_engines_error_naming_the_server(server: RolloutServer) -> None:
    client = RolloutClient(server.url)
    with pytest.raises(PromptTooLongError) as info:
        client.generate(request([1] * 30))
    assert "the context length is 32" in str(info.value)
    assert f"POST {server.url}/v1/completions, status 400" in str(info.value)
    client.load_weights(WeightUpdate(2))
    with pytest.raises(WeightVersionError, match=r"below the version it holds, 2"):
        client.load_weights(WeightUpdate(1))
    with pytest.raises(RolloutTypeError, match=r"takes a GenerateRequest"):
        client.generate({"prompt": [1]})  # type: ignore[arg-type]


class _Failing(ToyEngine):
    """A toy engine whose generate raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def generate(self, request: GenerateRequest) -> GenerateResult:
        raise self.error


@pytest.mark.parametrize("cls", [ERROR_CLASSES[name] for name in sorted(ERROR_CLASSES)])
def test_every_error_of_an_engine_comes_back_as_its_class(cls: type[ScRolloutError]) -> None:
    with RolloutServer(_Failing(cls("it broke"))) as server:
        with pytest.raises(cls) as info:
            RolloutClient(server.url).generate(request())
        assert type(info.value) is cls
        assert str(info.value).startswith("it broke (from POST http://")


def test_an_unexpected_engine_error_is_a_server_error() -> None:
    with RolloutServer(_Failing(ZeroDivisionError("oops"))) as server:
        with pytest.raises(RolloutServerError) as info:
            RolloutClient(server.url).generate(request())
        assert "status 500: InternalServerError" in str(info.value)
        assert "POST /v1/completions: ZeroDivisionError: oops" in str(info.value)


def test_a_server_binds_where_it_is_told_and_never_everywhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = ToyEngine()
    for everywhere in ("0.0.0.0", "::", ""):
        with pytest.raises(RolloutConfigError, match=r"binds every interface"):
            RolloutServer(engine, host=everywhere)
    monkeypatch.setenv("SC_ROLLOUT_HOST", "0.0.0.0")
    with pytest.raises(RolloutConfigError, match=r"'0\.0\.0\.0' binds every interface"):
        RolloutServer(engine)
    monkeypatch.delenv("SC_ROLLOUT_HOST")
    with RolloutServer(engine) as a, RolloutServer(engine, port=0) as b:
        assert a.host == "127.0.0.1"
        assert 0 < a.port != b.port > 0
        assert a.url == f"http://127.0.0.1:{a.port}"
    with pytest.raises(RolloutConfigError, match=r"port must be an int in 0\.\.65535, got -1"):
        RolloutServer(engine, port=-1)
    with pytest.raises(RolloutTypeError, match=r"takes a RolloutEngine, got str"):
        RolloutServer("engine")  # type: ignore[arg-type]


def test_a_stopped_server_is_unavailable_and_urls_are_checked() -> None:
    server = RolloutServer(ToyEngine()).start()
    client = RolloutClient(server.url)
    client.health()
    server.stop()
    with pytest.raises(ServerUnavailableError) as info:
        client.health()
    assert f"GET {server.url}/health" in str(info.value)
    assert isinstance(info.value, ConnectionError)
    for bad in ("127.0.0.1:80", "https://h:1", "http://h", "http://h:port"):
        with pytest.raises(RolloutConfigError, match=r"url must be http://host:port"):
            RolloutClient(bad)
    with pytest.raises(RolloutConfigError, match=r"timeout_s must be a finite number"):
        RolloutClient("http://h:1", timeout_s=0)


def test_a_slow_answer_is_a_timeout() -> None:
    with toy_servers(ToyEngineConfig(token_delay_s=0.1)) as (slow,):
        client = RolloutClient(slow.url, timeout_s=0.3)
        with pytest.raises(RolloutTimeoutError, match=r"no answer within 0\.3 s"):
            client.generate(request(max_tokens=20))


def test_cutting_the_connections_fails_the_calls_in_flight() -> None:
    with toy_servers(ToyEngineConfig(token_delay_s=0.05)) as (slow,):
        client = RolloutClient(slow.url)
        errors: list[BaseException] = []

        def call() -> None:
            try:
                client.generate(request(max_tokens=100))
            except ServerUnavailableError as exc:
                errors.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        wait_until(lambda: slow.engine.health().in_flight == 1, "the request in flight")
        assert client.close_connections() == 1
        thread.join(10)
        assert len(errors) == 1


def test_a_server_process_serves_until_killed() -> None:
    with ServerProcess.toy(ToyEngineConfig(seed=5), start_timeout_s=20) as process:
        assert process.alive()
        client = RolloutClient(process.url)
        local = ToyEngine(ToyEngineConfig(seed=5)).generate(request(seed=1))
        assert client.generate(request(seed=1)).token_ids == local.token_ids
        process.kill()
        assert not process.alive()
        with pytest.raises(ServerUnavailableError):
            client.health()


def test_a_server_process_that_fails_to_start_is_reported() -> None:
    with pytest.raises(RolloutServerError, match=r"exited with 3 before it was ready"):
        ServerProcess([sys.executable, "-c", "import sys; sys.exit(3)"], start_timeout_s=20)
    with pytest.raises(RolloutTimeoutError, match=r"was not ready within 0\.5 s"):
        ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], start_timeout_s=0.5)
    with pytest.raises(RolloutConfigError, match=r"binds every interface"):
        ServerProcess.toy(host="0.0.0.0")
    with pytest.raises(RolloutTypeError, match=r"must be a list of str"):
        ServerProcess("python -m sc_rollout toy")
