"""The contract's values validate on construction with errors that name the field and the
value, and survive the HTTP wire format unchanged."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from _rollout_helpers import PROPERTY
from hypothesis import given
from hypothesis import strategies as st
from sc_rollout import GenerateRequest, GenerateResult, SamplingParams, WeightUpdate
from sc_rollout.engines import EngineHealth
from sc_rollout.errors import (
    RolloutRequestError,
    RolloutServerError,
    RolloutTypeError,
    WeightVersionError,
)
from sc_rollout.serving._wire import (
    completion_body,
    health_body,
    health_from_body,
    request_body,
    request_from_body,
    result_from_body,
    update_body,
    update_from_body,
)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"max_tokens": 0}, RolloutRequestError, "max_tokens must be >= 1, got 0"),
        ({"max_tokens": 1.5}, RolloutTypeError, "max_tokens must be an int, got 1.5"),
        ({"max_tokens": True}, RolloutTypeError, "max_tokens must be an int, got True"),
        ({"temperature": -0.5}, RolloutRequestError, "temperature must be >= 0"),
        ({"temperature": math.nan}, RolloutRequestError, "temperature must be finite"),
        ({"temperature": 10**400}, RolloutRequestError, "temperature must be finite, got 1000"),
        ({"top_p": -(10**400)}, RolloutRequestError, "top_p must be finite, got -1000"),
        ({"temperature": "hot"}, RolloutTypeError, "temperature must be a number, got 'hot'"),
        ({"top_p": 0.0}, RolloutRequestError, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, RolloutRequestError, "top_p must be in (0, 1], got 1.5"),
        ({"seed": "7"}, RolloutTypeError, "seed must be an int, got '7'"),
        ({"stop_token_ids": [3, -1]}, RolloutRequestError, "stop_token_ids[1] must be >= 0"),
        ({"stop_token_ids": "ab"}, RolloutTypeError, "stop_token_ids must be a sequence"),
        ({"banned_token_ids": [-2]}, RolloutRequestError, "banned_token_ids[0] must be >= 0"),
    ],
)
def test_bad_sampling_params_name_the_field_and_value(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        SamplingParams(**kwargs)
    assert f"SamplingParams.{words}" in str(info.value)


def test_sampling_params_normalise_their_types() -> None:
    params = SamplingParams(max_tokens=3, temperature=1, top_p=1, stop_token_ids=[5, 6])
    assert params.stop_token_ids == (5, 6)
    assert isinstance(params.temperature, float)
    assert isinstance(params.top_p, float)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"prompt_ids": []}, RolloutRequestError, "prompt_ids must hold at least one token"),
        ({"prompt_ids": "abc"}, RolloutTypeError, "prompt_ids must be a sequence of ints"),
        ({"prompt_ids": [1, 2.0]}, RolloutTypeError, "prompt_ids[1] must be an int, got 2.0"),
        ({"prompt_ids": [4, -1]}, RolloutRequestError, "prompt_ids[1] must be >= 0, got -1"),
        ({"prompt_ids": [1], "request_id": ""}, RolloutRequestError, "request_id must not"),
        ({"prompt_ids": [1], "session_id": 3}, RolloutTypeError, "session_id must be a str"),
        ({"prompt_ids": [1], "sampling": {"max_tokens": 2}}, RolloutTypeError, "sampling must"),
    ],
)
def test_bad_requests_name_the_field_and_value(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        GenerateRequest(**kwargs)
    assert f"GenerateRequest.{words}" in str(info.value)


def test_requests_get_fresh_ids_and_tuples() -> None:
    first, second = GenerateRequest([1, 2]), GenerateRequest([1, 2])
    assert first.prompt_ids == (1, 2)
    assert first.request_id != second.request_id


def _result(**overrides: Any) -> GenerateResult:
    fields: dict[str, Any] = {
        "request_id": "r",
        "token_ids": (1, 2),
        "logprobs": (-0.5, -1.0),
        "finish_reason": "length",
        "weight_version": 2,
    }
    return GenerateResult(**{**fields, **overrides})


def test_results_check_their_fields() -> None:
    assert _result().min_weight_version == 2
    with pytest.raises(RolloutRequestError, match=r"2 token ids but 1 logprobs"):
        _result(logprobs=[-0.5])
    with pytest.raises(RolloutRequestError, match=r"finish_reason must be one of"):
        _result(finish_reason="done")
    with pytest.raises(WeightVersionError, match=r"min_weight_version 3 is above weight_version 2"):
        _result(min_weight_version=3)
    with pytest.raises(RolloutTypeError, match=r"logprobs must be a sequence of numbers"):
        _result(logprobs="ab")


@pytest.mark.parametrize(
    ("version", "error", "words"),
    [
        ("3", RolloutTypeError, "WeightUpdate.version must be an int, got '3' (str)"),
        (True, RolloutTypeError, "WeightUpdate.version must be an int, got True (bool)"),
        (1.0, RolloutTypeError, "WeightUpdate.version must be an int, got 1.0 (float)"),
        (None, RolloutTypeError, "WeightUpdate.version must be an int, got None"),
        (-1, WeightVersionError, "WeightUpdate.version must be >= 0, got -1"),
    ],
)
def test_a_weight_update_with_a_wrong_version_is_refused(
    version: object, error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        WeightUpdate(version)  # type: ignore[arg-type]
    assert words in str(info.value)
    # each is also the builtin it means
    assert isinstance(info.value, TypeError if error is RolloutTypeError else ValueError)


def test_a_weight_update_path() -> None:
    assert WeightUpdate(1, Path("/tmp/w.bin")).path == "/tmp/w.bin"  # type: ignore[arg-type]
    with pytest.raises(RolloutTypeError, match=r"WeightUpdate\.path must be a str or a path"):
        WeightUpdate(1, 5)  # type: ignore[arg-type]
    with pytest.raises(RolloutTypeError, match=r"non-empty text path"):
        WeightUpdate(1, "")


def test_engine_health_checks_its_fields() -> None:
    with pytest.raises(RolloutTypeError, match=r"EngineHealth\.paused must be a bool"):
        EngineHealth("m", 8, 0, paused=1, sleeping=False, in_flight=0)  # type: ignore[arg-type]
    with pytest.raises(RolloutRequestError, match=r"EngineHealth\.in_flight must be >= 0"):
        EngineHealth("m", 8, 0, paused=False, sleeping=False, in_flight=-1)


# --- the wire format ------------------------------------------------------------------------

_ids = st.lists(st.integers(0, 1000), min_size=1, max_size=20)
_sampling = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 100),
    temperature=st.floats(0, 5),
    top_p=st.floats(0.01, 1),
    seed=st.none() | st.integers(-(2**40), 2**40),
    stop_token_ids=st.lists(st.integers(0, 1000), max_size=3),
    banned_token_ids=st.lists(st.integers(0, 1000), max_size=3),
)
_requests = st.builds(
    GenerateRequest,
    prompt_ids=_ids,
    sampling=_sampling,
    request_id=st.text(min_size=1, max_size=12),
    session_id=st.none() | st.text(min_size=1, max_size=12),
)


def _over_json(body: dict[str, Any]) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(json.dumps(body))
    return decoded


@PROPERTY
@given(_requests)
def test_a_request_survives_the_wire(request: GenerateRequest) -> None:
    decoded, logprobs = request_from_body(_over_json(request_body(request)), "test")
    assert decoded == request
    assert logprobs


@PROPERTY
@given(
    st.lists(st.tuples(st.integers(0, 1000), st.floats(-50, 0)), max_size=20),
    st.sampled_from(["stop", "length", "abort"]),
    st.integers(0, 5),
    st.integers(0, 5),
    st.integers(1, 50),
)
def test_a_result_survives_the_wire(
    pairs: list[tuple[int, float]], reason: str, low: int, extra: int, prompt_tokens: int
) -> None:
    result = GenerateResult(
        request_id="r1",
        token_ids=tuple(t for t, _ in pairs),
        logprobs=tuple(p for _, p in pairs),
        finish_reason=reason,  # type: ignore[arg-type]
        weight_version=low + extra,
        min_weight_version=low,
    )
    body = _over_json(completion_body(result, prompt_tokens, "m", logprobs=True))
    assert body["usage"]["completion_tokens"] == len(pairs)
    assert body["usage"]["total_tokens"] == len(pairs) + prompt_tokens
    assert result_from_body(body, "http://x:1") == GenerateResult(
        **{**result.__dict__, "server": "http://x:1"}
    )


def test_a_malformed_answer_is_a_server_error() -> None:
    with pytest.raises(RolloutServerError, match=r"x:1: a malformed completion \(IndexError"):
        result_from_body({"choices": []}, "http://x:1")
    with pytest.raises(RolloutServerError, match=r"finish_reason 'eos'"):
        result_from_body({"choices": [{"finish_reason": "eos"}]}, "http://x:1")
    with pytest.raises(RolloutServerError, match=r"a malformed health answer"):
        health_from_body({"model": "m"}, "http://x:1")


def test_health_and_weights_survive_the_wire() -> None:
    health = EngineHealth("m", 64, 3, paused=True, sleeping=False, in_flight=2)
    assert health_from_body(_over_json(health_body(health)), "s") == health
    update = WeightUpdate(4, "/w")
    assert update_from_body(_over_json(update_body(update))) == update
