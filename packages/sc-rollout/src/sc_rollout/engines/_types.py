"""The values of the rollout-engine contract: what a generation request carries, what it
returns, a weight update and an engine's health. Each validates itself on construction and
raises a typed error that names the class, the field and the offending value."""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .._errors import RolloutRequestError, RolloutTypeError, WeightVersionError

__all__ = [
    "FINISH_REASONS",
    "EngineHealth",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "SamplingParams",
    "WeightUpdate",
    "check_int",
]

#: why a generation ended: a stop token was sampled, ``max_tokens`` were produced, or the
#: request was aborted (its tokens so far are kept)
FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS: tuple[FinishReason, ...] = ("stop", "length", "abort")


def check_int(
    value: object,
    where: str,
    minimum: int | None = None,
    error: type[ValueError] = RolloutRequestError,
) -> int:
    """``value`` as an int (``bool`` is refused); below ``minimum`` is an ``error`` (a
    request's by default, :class:`RolloutConfigError` for a constructor's argument).
    ``where`` names the field in the message."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise RolloutTypeError(f"{where} must be an int, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise error(f"{where} must be >= {minimum}, got {value}")
    return value


def _check_float(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RolloutTypeError(f"{where} must be a number, got {value!r} ({type(value).__name__})")
    try:
        number = float(value)
    except OverflowError:  # an int beyond the largest float
        number = math.inf
    if not math.isfinite(number):
        raise RolloutRequestError(f"{where} must be finite, got {value!r:.40}")
    return number


def _int_tuple(values: object, where: str) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise RolloutTypeError(
            f"{where} must be a sequence of ints, got {values!r} ({type(values).__name__})"
        )
    return tuple(check_int(v, f"{where}[{i}]", 0) for i, v in enumerate(values))


def _check_id(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise RolloutTypeError(f"{where} must be a str, got {value!r} ({type(value).__name__})")
    if not value:
        raise RolloutRequestError(f"{where} must not be empty")
    return value


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    ``max_tokens`` (>= 1) new tokens at most; ``temperature`` >= 0 (0: greedy);
    ``top_p`` in (0, 1] (nucleus sampling); ``seed`` makes the sampling reproducible
    (``None``: random); generation stops after a token in ``stop_token_ids`` (that token is
    part of the output; any sequence, stored as a tuple). Tokens in ``banned_token_ids`` are
    never sampled, greedily or not (an agent's tool budget: no second call); the log-probs
    reported stay the model's own, as for top-p.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: Sequence[int] = ()
    banned_token_ids: Sequence[int] = ()

    def __post_init__(self) -> None:
        check_int(self.max_tokens, "SamplingParams.max_tokens", 1)
        temperature = _check_float(self.temperature, "SamplingParams.temperature")
        if temperature < 0:
            raise RolloutRequestError(
                f"SamplingParams.temperature must be >= 0 (0: greedy), got {self.temperature}"
            )
        top_p = _check_float(self.top_p, "SamplingParams.top_p")
        if not 0 < top_p <= 1:
            raise RolloutRequestError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            check_int(self.seed, "SamplingParams.seed")
        stops = _int_tuple(self.stop_token_ids, "SamplingParams.stop_token_ids")
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_p", top_p)
        object.__setattr__(self, "stop_token_ids", stops)
        banned = _int_tuple(self.banned_token_ids, "SamplingParams.banned_token_ids")
        object.__setattr__(self, "banned_token_ids", banned)


def _new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class GenerateRequest:
    """One completion of ``prompt_ids`` (token ids, at least one; any sequence, stored as a
    tuple).

    ``request_id`` names the request for :meth:`~sc_rollout.RolloutEngine.abort` (a fresh
    one by default); ``session_id`` keeps the requests of one session (an agent's turns) on
    one server of a :class:`~sc_rollout.Router`.
    """

    prompt_ids: Sequence[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=_new_request_id)
    session_id: str | None = None

    def __post_init__(self) -> None:
        prompt = _int_tuple(self.prompt_ids, "GenerateRequest.prompt_ids")
        if not prompt:
            raise RolloutRequestError("GenerateRequest.prompt_ids must hold at least one token")
        object.__setattr__(self, "prompt_ids", prompt)
        if not isinstance(self.sampling, SamplingParams):
            raise RolloutTypeError(
                "GenerateRequest.sampling must be a SamplingParams, got "
                f"{type(self.sampling).__name__}"
            )
        _check_id(self.request_id, "GenerateRequest.request_id")
        if self.session_id is not None:
            _check_id(self.session_id, "GenerateRequest.session_id")


@dataclass(frozen=True)
class GenerateResult:
    """The tokens an engine generated for one request, each with its log-probability under
    the model (after temperature, before top-p: ``log_softmax(logits / temperature)``, what
    a trainer recomputes; greedy requests report the raw logits'), and why it ended.

    ``weight_version`` is the version of the weights the last token was sampled with (the
    engine's version when the request ended, if it produced none); ``min_weight_version``
    the version of the first (the same, unless the weights changed during the request;
    ``None`` on construction means the same). ``server`` names who answered: the URL for a
    :class:`~sc_rollout.RolloutClient`, the server's name for a
    :class:`~sc_rollout.Router`, ``None`` for an engine called in-process.
    """

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: int
    min_weight_version: int | None = None
    server: str | None = None

    def __post_init__(self) -> None:
        _check_id(self.request_id, "GenerateResult.request_id")
        tokens = _int_tuple(self.token_ids, "GenerateResult.token_ids")
        values: object = self.logprobs
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise RolloutTypeError(
                f"GenerateResult.logprobs must be a sequence of numbers, got {values!r}"
            )
        logprobs = tuple(
            _check_float(v, f"GenerateResult.logprobs[{i}]") for i, v in enumerate(values)
        )
        if len(logprobs) != len(tokens):
            raise RolloutRequestError(
                f"GenerateResult {self.request_id}: {len(tokens)} token ids but "
                f"{len(logprobs)} logprobs"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise RolloutRequestError(
                f"GenerateResult.finish_reason must be one of {FINISH_REASONS}, "
                f"got {self.finish_reason!r}"
            )
        version = check_int(self.weight_version, "GenerateResult.weight_version", 0)
        low = self.min_weight_version
        low = version if low is None else check_int(low, "GenerateResult.min_weight_version", 0)
        if low > version:
            raise WeightVersionError(
                f"GenerateResult {self.request_id}: min_weight_version {low} is above "
                f"weight_version {version}"
            )
        if self.server is not None and not isinstance(self.server, str):
            raise RolloutTypeError(f"GenerateResult.server must be a str, got {self.server!r}")
        object.__setattr__(self, "token_ids", tokens)
        object.__setattr__(self, "logprobs", logprobs)
        object.__setattr__(self, "min_weight_version", low)


@dataclass(frozen=True)
class WeightUpdate:
    """New weights for an engine, at ``version`` (an int >= 0; versions only grow).

    ``path`` names a file holding them on the engine's node (written atomically by whoever
    pushes); ``None`` when the engine needs no file (the toy engine's weights follow from
    the version). A path-like is stored as ``str``.
    """

    version: int
    path: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.version, bool) or not isinstance(self.version, int):
            raise RolloutTypeError(
                f"WeightUpdate.version must be an int, got {self.version!r} "
                f"({type(self.version).__name__})"
            )
        if self.version < 0:
            raise WeightVersionError(f"WeightUpdate.version must be >= 0, got {self.version}")
        if self.path is not None:
            if not isinstance(self.path, (str, os.PathLike)):
                raise RolloutTypeError(
                    f"WeightUpdate.path must be a str or a path, got {self.path!r}"
                )
            path = os.fspath(self.path)
            if not isinstance(path, str) or not path:
                raise RolloutTypeError(
                    f"WeightUpdate.path must be a non-empty text path, got {self.path!r}"
                )
            object.__setattr__(self, "path", path)


@dataclass(frozen=True)
class EngineHealth:
    """What an engine reports about itself: the model it serves and its context length, the
    weight version it holds, whether it is paused or asleep, and its requests in flight."""

    model: str
    context_length: int
    weight_version: int
    paused: bool
    sleeping: bool
    in_flight: int

    def __post_init__(self) -> None:
        _check_id(self.model, "EngineHealth.model")
        check_int(self.context_length, "EngineHealth.context_length", 1)
        check_int(self.weight_version, "EngineHealth.weight_version", 0)
        check_int(self.in_flight, "EngineHealth.in_flight", 0)
        for name in ("paused", "sleeping"):
            if not isinstance(getattr(self, name), bool):
                raise RolloutTypeError(
                    f"EngineHealth.{name} must be a bool, got {getattr(self, name)!r}"
                )
