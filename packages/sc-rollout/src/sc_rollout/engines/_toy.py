"""The toy engine: the test and reference implementation of the rollout-engine contract.

It is not a language model. Its "weights" are a table of next-token logits over a tiny
vocabulary, indexed by the previous token (a bigram model), drawn from a random generator
seeded by the engine's seed, the weight version and the bytes of the weight file or
directory (if any); so the same seed, version and file give the same outputs on every
process, and new weights change them. It needs nothing beyond the standard library and
answers in microseconds, or after ``token_delay_s`` per token, which makes a slow server on
demand. Tests of servers and routers, and the benchmark of the router, run on it; real
models are served by the vLLM engine (``_vllm``) and sc-workers' built-in engine.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._errors import (
    EngineStateError,
    PromptTooLongError,
    RolloutConfigError,
    RolloutRequestError,
    RolloutTypeError,
    WeightLoadError,
    WeightVersionError,
)
from ._types import (
    EngineHealth,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightUpdate,
    check_int,
)

__all__ = ["ToyEngine", "ToyEngineConfig"]

_log = logging.getLogger("sc_rollout.toy")


@dataclass(frozen=True)
class ToyEngineConfig:
    """The toy engine's settings: a vocabulary of ``vocab_size`` token ids (>= 2), a
    context of ``context_length`` positions (prompt plus completion), ``token_delay_s``
    seconds of waiting before each token (0: none), the ``seed`` of its weights, and the
    ``model`` name it reports."""

    vocab_size: int = 16
    context_length: int = 128
    token_delay_s: float = 0.0
    seed: int = 0
    model: str = "sc-toy"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length"):
            check_int(getattr(self, name), f"ToyEngineConfig.{name}", 2, RolloutConfigError)
        check_int(self.seed, "ToyEngineConfig.seed")
        delay = self.token_delay_s
        if isinstance(delay, bool) or not isinstance(delay, (int, float)):
            raise RolloutTypeError(f"ToyEngineConfig.token_delay_s must be a number, got {delay!r}")
        if not math.isfinite(delay) or delay < 0:
            raise RolloutConfigError(
                f"ToyEngineConfig.token_delay_s must be a finite number >= 0, got {delay!r}"
            )
        if not isinstance(self.model, str) or not self.model:
            raise RolloutConfigError(
                f"ToyEngineConfig.model must be a non-empty str, got {self.model!r}"
            )
        object.__setattr__(self, "token_delay_s", float(delay))


@dataclass(frozen=True)
class _Weights:
    """The logits table of one version: ``logits[prev][next]`` and its log-softmax rows."""

    logits: tuple[tuple[float, ...], ...]
    logprobs: tuple[tuple[float, ...], ...]


def _weights(config: ToyEngineConfig, version: int, digest: str) -> _Weights:
    rng = random.Random(f"sc-toy:{config.seed}:{version}:{digest}")
    size = config.vocab_size
    logits = tuple(tuple(rng.gauss(0.0, 2.0) for _ in range(size)) for _ in range(size))
    return _Weights(logits, tuple(_log_softmax(row) for row in logits))


def _digest(path: Path) -> str:
    """The sha256 of a weight file's bytes; of a directory's files (names and bytes, in
    name order, sub-directories included), as a directory of safetensors files is pushed."""
    if not path.is_dir():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    total = hashlib.sha256()
    for item in sorted(p for p in path.rglob("*") if p.is_file()):
        total.update(item.relative_to(path).as_posix().encode("utf-8") + b"\0")
        total.update(item.read_bytes())
    return total.hexdigest()


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(x - top) for x in values))


def _log_softmax(row: tuple[float, ...]) -> tuple[float, ...]:
    log_total = _logsumexp(row)
    return tuple(x - log_total for x in row)


def _token_logprob(
    weights: _Weights, previous: int, token: int, temperature: float, banned: frozenset[int]
) -> float:
    """``token``'s log-prob after ``previous``, as the contract says: the logits divided by
    ``temperature`` (greedy requests, and a temperature so small that the divided logits
    overflow, sampled greedily too: the raw ones), renormalised over the tokens not in
    ``banned`` (what the sampler drew from, and what a trainer that bans the same tokens
    recomputes)."""
    row = weights.logits[previous]
    scaled = tuple(x / temperature for x in row) if temperature not in (0, 1) else row
    if not all(math.isfinite(x) for x in scaled):
        scaled = row
    if not banned and scaled is row:
        return weights.logprobs[previous][token]
    return scaled[token] - _logsumexp([x for i, x in enumerate(scaled) if i not in banned])


def _sample(logits: tuple[float, ...], sampling: SamplingParams, rng: random.Random) -> int:
    """One token from ``logits`` with the temperature and top-p of ``sampling``."""
    banned = frozenset(sampling.banned_token_ids)
    allowed = [i for i in range(len(logits)) if i not in banned]
    if sampling.temperature == 0:
        return max(allowed, key=logits.__getitem__)
    scaled = [x / sampling.temperature for x in logits]
    top = max(scaled[i] for i in allowed)
    weights = [0.0 if i in banned else math.exp(x - top) for i, x in enumerate(scaled)]
    total = sum(weights)
    order = sorted(range(len(weights)), key=lambda i: -weights[i])
    kept: list[int] = []
    mass = 0.0
    for token in order:
        kept.append(token)
        mass += weights[token] / total
        if mass >= sampling.top_p:
            break
    point = rng.random() * sum(weights[t] for t in kept)
    for token in kept:
        point -= weights[token]
        if point < 0:
            return token
    return kept[-1]


def _shown(number: int) -> str:
    """``number`` in decimal, or its size where Python will not write it (an int of more
    than 4300 digits: a max_tokens of 4300 nines, which JSON carries, plus the prompt)."""
    try:
        return str(number)
    except ValueError:
        return f"(an int of {number.bit_length()} bits)"


class _Flight:
    """One request in flight: whether it was aborted."""

    __slots__ = ("aborted",)

    def __init__(self) -> None:
        self.aborted = False


class ToyEngine:
    """The test and reference engine (see the module's documentation): a seeded bigram
    sampler over a tiny vocabulary, thread-safe, with an optional delay per token.

    It implements :class:`~sc_rollout.RolloutEngine` exactly as the contract says, so it is
    what the server, the router and their tests run on. It is no model of anything: use it
    to test plumbing, not learning.
    """

    def __init__(self, config: ToyEngineConfig | None = None) -> None:
        if config is None:
            config = ToyEngineConfig()
        if not isinstance(config, ToyEngineConfig):
            raise RolloutTypeError(
                f"ToyEngine(config=...) takes a ToyEngineConfig, got {type(config).__name__}"
            )
        self._config = config
        self._cond = threading.Condition()
        self._version = 0
        self._digest = ""
        self._weights: _Weights | None = _weights(config, 0, "")
        self._paused = False
        self._sleep_level = 0
        self._flights: dict[str, _Flight] = {}

    @property
    def config(self) -> ToyEngineConfig:
        """The engine's settings."""
        return self._config

    def __repr__(self) -> str:
        return f"ToyEngine({self._config!r}, weight_version={self._version})"

    # --- generation -------------------------------------------------------------------------

    def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample a completion of ``request`` (see :class:`~sc_rollout.RolloutEngine`)."""
        if not isinstance(request, GenerateRequest):
            raise RolloutTypeError(
                f"{self._config.model}: generate() takes a GenerateRequest, got "
                f"{type(request).__name__}"
            )
        self._check(request)
        flight = _Flight()
        rid = request.request_id
        with self._cond:
            if self._sleep_level:
                raise EngineStateError(
                    f"{self._config.model}: generate(request {rid}) while the engine sleeps; "
                    "call wake_up() first"
                )
            if rid in self._flights:
                raise RolloutRequestError(
                    f"{self._config.model}: request id {rid!r} is already in flight"
                )
            self._flights[rid] = flight
        try:
            return self._run(request, flight)
        finally:
            with self._cond:
                del self._flights[rid]
                self._cond.notify_all()

    def _check(self, request: GenerateRequest) -> None:
        size = self._config.vocab_size
        for position, token in enumerate(request.prompt_ids):
            if token >= size:
                raise RolloutRequestError(
                    f"{self._config.model}: request {request.request_id}: prompt token id "
                    f"{token} at position {position} is outside the vocabulary of {size} "
                    f"tokens (0..{size - 1})"
                )
        length = len(request.prompt_ids)
        need = length + request.sampling.max_tokens
        if need > self._config.context_length:
            raise PromptTooLongError(
                f"{self._config.model}: request {request.request_id}: a prompt of {length} "
                f"tokens with max_tokens={_shown(request.sampling.max_tokens)} needs "
                f"{_shown(need)} positions; the context length is {self._config.context_length}"
            )

    def _run(self, request: GenerateRequest, flight: _Flight) -> GenerateResult:
        sampling = request.sampling
        rng = random.Random(sampling.seed)  # seed None: fresh randomness from the OS
        stops = frozenset(sampling.stop_token_ids)
        banned = frozenset(sampling.banned_token_ids)
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        previous = request.prompt_ids[-1]
        reason: FinishReason = "length"
        for _ in range(sampling.max_tokens):
            step = self._next_step(flight)
            if step is None:
                reason = "abort"
                break
            weights, version = step
            token = _sample(weights.logits[previous], sampling, rng)
            tokens.append(token)
            logprobs.append(_token_logprob(weights, previous, token, sampling.temperature, banned))
            versions.append(version)
            previous = token
            if token in stops:
                reason = "stop"
                break
        if not versions:
            with self._cond:
                versions.append(self._version)
        return GenerateResult(
            request_id=request.request_id,
            token_ids=tuple(tokens),
            logprobs=tuple(logprobs),
            finish_reason=reason,
            weight_version=versions[-1],
            min_weight_version=versions[0],
        )

    def _next_step(self, flight: _Flight) -> tuple[_Weights, int] | None:
        """Wait out the token delay and any pause; the weights to sample the next token
        with and their version, or ``None`` once the request is aborted."""
        with self._cond:
            deadline = time.monotonic() + self._config.token_delay_s
            while not flight.aborted and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            while self._paused and not flight.aborted:
                self._cond.wait()
            if flight.aborted or self._weights is None:
                return None
            return self._weights, self._version

    def abort(self, request_id: str) -> bool:
        """End request ``request_id`` now (its tokens so far are returned); ``True`` if it
        was in flight."""
        with self._cond:
            flight = self._flights.get(request_id)
            if flight is None:
                return False
            flight.aborted = True
            self._cond.notify_all()
            return True

    # --- state ------------------------------------------------------------------------------

    def pause(self) -> None:
        """Hold every request before its next token until :meth:`resume`."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        """Let paused requests continue."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def load_weights(self, update: WeightUpdate) -> int:
        """Take the weights of ``update`` (the bytes of the file it names, or of the files of
        the directory it names, seed the table); requests in flight sample their next token
        with them. Returns the version."""
        if not isinstance(update, WeightUpdate):
            raise RolloutTypeError(
                f"{self._config.model}: load_weights() takes a WeightUpdate, got "
                f"{type(update).__name__}"
            )
        self._check_version(update.version)
        digest = ""
        if update.path is not None:
            try:
                digest = _digest(Path(update.path))
            except (OSError, ValueError) as exc:  # ValueError: a NUL, or a name not encodable
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise WeightLoadError(
                    f"{self._config.model}: load_weights(version={update.version}): cannot "
                    f"read {update.path!r}: {reason}"
                ) from exc
        weights = _weights(self._config, update.version, digest)
        with self._cond:
            self._check_version(update.version)
            self._version = update.version
            self._digest = digest
            self._weights = None if self._sleep_level == 2 else weights
            self._cond.notify_all()
        _log.debug("%s: weights at version %d", self._config.model, update.version)
        return update.version

    def _check_version(self, version: int) -> None:
        if version < self._version:
            raise WeightVersionError(
                f"{self._config.model}: load_weights(version={version}) is below the version "
                f"it holds, {self._version}"
            )

    def weight_version(self) -> int:
        """The version of the weights the engine holds."""
        with self._cond:
            return self._version

    def health(self) -> EngineHealth:
        """The engine's state now."""
        with self._cond:
            return EngineHealth(
                model=self._config.model,
                context_length=self._config.context_length,
                weight_version=self._version,
                paused=self._paused,
                sleeping=self._sleep_level > 0,
                in_flight=len(self._flights),
            )

    def sleep(self, level: int = 1) -> None:
        """Free the engine's memory: level 1 keeps the weights, level 2 drops them (rebuilt
        by :meth:`wake_up` at the current version). Refused while requests are in flight."""
        if check_int(level, "sleep(level)") not in (1, 2):
            raise RolloutRequestError(
                f"{self._config.model}: sleep(level) takes 1 or 2, got {level}"
            )
        with self._cond:
            if self._flights:
                raise EngineStateError(
                    f"{self._config.model}: sleep(level={level}) while {len(self._flights)} "
                    "request(s) are in flight; abort them or wait"
                )
            self._sleep_level = max(self._sleep_level, level)
            if level == 2:
                self._weights = None

    def wake_up(self) -> None:
        """Leave sleep; the weights are the current version's again."""
        with self._cond:
            if self._weights is None:
                self._weights = _weights(self._config, self._version, self._digest)
            self._sleep_level = 0
            self._cond.notify_all()
