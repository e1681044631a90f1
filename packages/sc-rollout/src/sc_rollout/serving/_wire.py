"""The HTTP wire format shared by the server and the client: JSON bodies of the
OpenAI-compatible completions endpoint (token ids in, token ids and log-probs out), of the
control endpoints, and of errors, which travel by class name.

``POST /v1/completions`` takes OpenAI's fields with vLLM's token extensions: ``prompt`` is a
list of token ids, ``logprobs`` (``0``: the sampled tokens' log-probs) and
``return_token_ids``; sc adds ``request_id`` (for ``/abort``) and returns ``weight_version``
and ``min_weight_version`` with every completion.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Mapping
from typing import Any

from .. import _errors
from .._errors import (
    EngineStateError,
    RolloutRequestError,
    RolloutServerError,
    RolloutTypeError,
    ScRolloutError,
    SessionStateError,
    WeightLoadError,
    WeightMismatchError,
    WeightVersionError,
)
from ..engines._types import (
    FINISH_REASONS,
    EngineHealth,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightUpdate,
    check_int,
)

__all__ = [
    "ERROR_CLASSES",
    "MAX_JSON_DEPTH",
    "completion_body",
    "decode_body",
    "error_body",
    "error_status",
    "health_body",
    "health_from_body",
    "json_depth",
    "request_body",
    "request_from_body",
    "result_from_body",
    "update_body",
    "update_from_body",
]

#: the errors that travel over HTTP by name, and come back as the same class: every one of
#: sc-rollout's
ERROR_CLASSES: dict[str, type[ScRolloutError]] = {
    name: getattr(_errors, name) for name in _errors.__all__
}

_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (RolloutRequestError, 400),
    (RolloutTypeError, 400),
    (WeightVersionError, 409),
    (EngineStateError, 409),
    (SessionStateError, 409),
    (WeightLoadError, 422),
    (WeightMismatchError, 422),
)


def error_status(exc: BaseException) -> int:
    """The HTTP status an error from an engine is answered with (500 when unexpected)."""
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_body(kind: str, message: str, status: int) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "code"}}``."""
    return {"error": {"message": message, "type": kind, "code": status}}


#: how deep the arrays and objects of a JSON body may nest (the body itself is level 1): a
#: deeper body is refused before it is parsed, so that nothing that reads it later (the
#: parser, a ``repr`` in an error message, a chat template) recurses that deep
MAX_JSON_DEPTH = 64

#: a JSON string (escapes included), and a bracket outside of one
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_JSON_BRACKET = re.compile(r"[\[\]{}]")
#: what JSON calls whitespace (``str.strip()`` would take more: "\x1c", "\xa0", ...)
_JSON_SPACE = " \t\n\r"


def json_depth(text: str) -> int:
    """How deep the arrays and objects of JSON ``text`` nest (0 for a scalar), counted
    without parsing (nor recursing): brackets inside strings are text."""
    brackets = _JSON_BRACKET.findall(_JSON_STRING.sub("", text))
    steps = (1 if b in "[{" else -1 for b in brackets)
    return max(itertools.accumulate(steps), default=0)


def decode_body(raw: bytes, where: str) -> dict[str, Any]:
    """A request or response body as a JSON object; ``where`` names the endpoint. A body
    that is not UTF-8 JSON, that nests deeper than :data:`MAX_JSON_DEPTH`, or that holds a
    number Python does not read (an int of more than 4300 digits) is a
    :class:`RolloutRequestError`; one that is no object a :class:`RolloutTypeError`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RolloutRequestError(f"{where}: the body is not valid JSON: {exc}") from None
    if not text.strip(_JSON_SPACE):  # no body: an empty object
        return {}
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise RolloutRequestError(
            f"{where}: the body nests {depth} levels deep; at most {MAX_JSON_DEPTH} are read"
        )
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RolloutRequestError(f"{where}: the body is not valid JSON: {exc}") from None
    except RecursionError:  # not JSON, but nested too deep for the parser to find out
        raise RolloutRequestError(
            f"{where}: the body is not valid JSON and nests too deep to be read"
        ) from None
    except ValueError as exc:  # valid JSON: an int of more digits than Python converts
        raise RolloutRequestError(
            f"{where}: the body holds a number Python cannot read: {exc}"
        ) from None
    if not isinstance(body, dict):
        raise RolloutTypeError(
            f"{where}: the body must be a JSON object, got {type(body).__name__}"
        )
    return body


def _get(body: Mapping[str, Any], key: str, default: Any) -> Any:
    """``body[key]``, or ``default`` when it is missing or null (OpenAI's "use the default")."""
    value = body.get(key)
    return default if value is None else value


# --- completions ----------------------------------------------------------------------------


def request_body(request: GenerateRequest) -> dict[str, Any]:
    """The completions body of ``request`` (what :class:`~sc_rollout.RolloutClient` sends)."""
    sampling = request.sampling
    body: dict[str, Any] = {
        "prompt": list(request.prompt_ids),
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
        "stop_token_ids": list(sampling.stop_token_ids),
        "banned_token_ids": list(sampling.banned_token_ids),
        "logprobs": 0,
        "return_token_ids": True,
        "request_id": request.request_id,
    }
    if request.session_id is not None:
        body["session_id"] = request.session_id
    return body


def request_from_body(body: Mapping[str, Any], where: str) -> tuple[GenerateRequest, bool]:
    """The request in a completions body, and whether it asks for log-probs."""
    prompt = body.get("prompt")
    if prompt is None:
        raise RolloutRequestError(f"{where}: 'prompt' (a list of token ids) is required")
    if isinstance(prompt, str):
        raise RolloutRequestError(
            f"{where}: 'prompt' must be a list of token ids (this server has no tokenizer), "
            f"got a str: {prompt[:40]!r}"
        )
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        raise RolloutRequestError(
            f"{where}: one prompt per request (a list of token ids), got a batch of {len(prompt)}"
        )
    if _get(body, "n", 1) != 1:
        raise RolloutRequestError(f"{where}: n must be 1, got {body['n']!r}")
    if _get(body, "stream", False) is not False:
        raise RolloutRequestError(f"{where}: stream is not supported, got {body['stream']!r}")
    if _get(body, "stop", None):
        raise RolloutRequestError(
            f"{where}: 'stop' strings are not supported (no tokenizer); use stop_token_ids"
        )
    logprobs = body.get("logprobs")
    if logprobs is not None:
        check_int(logprobs, f"{where}: logprobs", 0)
    sampling = SamplingParams(
        max_tokens=_get(body, "max_tokens", 16),
        temperature=_get(body, "temperature", 1.0),
        top_p=_get(body, "top_p", 1.0),
        seed=body.get("seed"),
        stop_token_ids=_get(body, "stop_token_ids", ()),
        banned_token_ids=_get(body, "banned_token_ids", ()),
    )
    extra: dict[str, Any] = {}
    if body.get("request_id") is not None:
        extra["request_id"] = body["request_id"]
    request = GenerateRequest(
        prompt_ids=prompt, sampling=sampling, session_id=body.get("session_id"), **extra
    )
    return request, logprobs is not None


def completion_body(
    result: GenerateResult, prompt_tokens: int, model: str, logprobs: bool
) -> dict[str, Any]:
    """OpenAI's completion object for ``result``, with vLLM's ``token_ids`` and sc's weight
    versions."""
    tokens = list(result.token_ids)
    choice: dict[str, Any] = {
        "index": 0,
        "text": "",
        "token_ids": tokens,
        "finish_reason": result.finish_reason,
        "logprobs": None,
    }
    if logprobs:
        choice["logprobs"] = {
            "tokens": [f"token_id:{t}" for t in tokens],
            "token_logprobs": list(result.logprobs),
            "top_logprobs": None,
            "text_offset": [0] * len(tokens),
        }
    return {
        "id": f"cmpl-{result.request_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(tokens),
            "total_tokens": prompt_tokens + len(tokens),
        },
        "request_id": result.request_id,
        "weight_version": result.weight_version,
        "min_weight_version": result.min_weight_version,
    }


def result_from_body(body: Mapping[str, Any], server: str) -> GenerateResult:
    """The result in a completion object from ``server`` (asked with logprobs)."""
    try:
        choice = body["choices"][0]
        reason = choice["finish_reason"]
        if reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason {reason!r}")
        return GenerateResult(
            request_id=body["request_id"],
            token_ids=choice["token_ids"],
            logprobs=choice["logprobs"]["token_logprobs"],
            finish_reason=reason,
            weight_version=body["weight_version"],
            min_weight_version=body.get("min_weight_version"),
            server=server,
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise RolloutServerError(
            f"{server}: a malformed completion ({type(exc).__name__}: {exc}): {dict(body)!r:.200}"
        ) from None


# --- control endpoints ----------------------------------------------------------------------


def health_body(health: EngineHealth) -> dict[str, Any]:
    return {
        "status": "ok",
        "model": health.model,
        "context_length": health.context_length,
        "weight_version": health.weight_version,
        "paused": health.paused,
        "sleeping": health.sleeping,
        "in_flight": health.in_flight,
    }


def health_from_body(body: Mapping[str, Any], server: str) -> EngineHealth:
    try:
        return EngineHealth(
            model=body["model"],
            context_length=body["context_length"],
            weight_version=body["weight_version"],
            paused=body["paused"],
            sleeping=body["sleeping"],
            in_flight=body["in_flight"],
        )
    except (KeyError, ScRolloutError) as exc:
        raise RolloutServerError(
            f"{server}: a malformed health answer ({exc}): {dict(body)!r:.200}"
        ) from None


def update_body(update: WeightUpdate) -> dict[str, Any]:
    return {"version": update.version, "path": update.path}


def update_from_body(body: Mapping[str, Any]) -> WeightUpdate:
    """The weight update in a ``POST /weights`` body (its dataclass checks the types)."""
    # JSON values of any type: WeightUpdate checks them and raises its typed errors
    return WeightUpdate(version=body.get("version"), path=body.get("path"))  # type: ignore[arg-type]
