"""Agent sessions: a multi-turn rollout at the level of token ids.

An :class:`AgentSession` holds one agent's token sequence: the prompt, then the tokens the
model generated (one :class:`Turn` per :meth:`~AgentSession.generate`) and the tokens the
environment appended between turns (an :class:`AppendedTokens` per
:meth:`~AgentSession.append_tokens`: a tool's answer, a user's message). Each turn sends the
whole sequence so far, exactly as held, as the prompt of one request: nothing is ever
re-tokenized, so the tokens a trainer sees are the tokens the model was conditioned on.
Every request carries the session id, so a :class:`~sc_rollout.Router` keeps the session on
one server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._errors import (
    PromptTooLongError,
    RolloutRequestError,
    RolloutTypeError,
    SessionStateError,
)
from ..engines._engine import RolloutEngine
from ..engines._types import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    check_int,
)
from ..routing._router import Router

__all__ = ["AgentSession", "AppendedTokens", "Turn"]


@dataclass(frozen=True)
class Turn:
    """One model turn of an :class:`AgentSession`: the tokens the engine generated, their
    log-probs and why the turn ended, the weight versions it ran under (the first token's
    ``min_weight_version`` to the last one's ``weight_version``) and the server that
    answered (``None`` for an engine called in-process).

    ``index`` counts the session's model turns from 0 (the request id is
    ``<session_id>-t<index>``); ``start`` is the turn's offset in the session's
    ``response_ids``. An aborted turn (``finish_reason == "abort"``) keeps the tokens it
    produced and says so in :attr:`aborted`. ``banned_token_ids`` are the tokens its
    sampling banned (``SamplingParams.banned_token_ids``): the policy it sampled is the
    model's renormalised over the other tokens, which a trainer recomputes.
    """

    index: int
    start: int
    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    min_weight_version: int
    weight_version: int
    server: str | None = None
    banned_token_ids: tuple[int, ...] = ()

    @property
    def aborted(self) -> bool:
        """Whether the engine's answer was aborted (its tokens so far are kept)."""
        return self.finish_reason == "abort"

    def to_dict(self) -> dict[str, Any]:
        """The turn as plain values (lists, str, int)."""
        return {
            "kind": "model",
            "index": self.index,
            "start": self.start,
            "request_id": self.request_id,
            "token_ids": list(self.token_ids),
            "logprobs": list(self.logprobs),
            "finish_reason": self.finish_reason,
            "min_weight_version": self.min_weight_version,
            "weight_version": self.weight_version,
            "server": self.server,
            "banned_token_ids": list(self.banned_token_ids),
        }


@dataclass(frozen=True)
class AppendedTokens:
    """Tokens appended to an :class:`AgentSession` that the model did not generate (masked
    out of training): ``role`` names who produced them (``"tool"`` by default); ``start`` is
    their offset in the session's ``response_ids``."""

    role: str
    start: int
    token_ids: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """The segment as plain values (lists, str, int)."""
        return {
            "kind": "appended",
            "role": self.role,
            "start": self.start,
            "token_ids": list(self.token_ids),
        }


def _tokens(values: object, where: str) -> tuple[int, ...]:
    """``values`` as a non-empty tuple of token ids (ints >= 0)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise RolloutTypeError(
            f"{where} must be a sequence of token ids (ints), got {values!r} "
            f"({type(values).__name__})"
        )
    tokens = tuple(check_int(v, f"{where}[{i}]", 0) for i, v in enumerate(values))
    if not tokens:
        raise RolloutRequestError(f"{where} must hold at least one token")
    return tokens


class AgentSession:
    """One agent's multi-turn rollout on ``engine`` (a :class:`~sc_rollout.Router`, a
    :class:`~sc_rollout.RolloutClient` or an engine in-process), starting from
    ``prompt_ids``.

    :meth:`generate` runs one model turn on everything so far; :meth:`append_tokens` adds
    the environment's tokens. The accumulated rollout is read from :attr:`prompt_ids`,
    :attr:`response_ids` (everything after the prompt, in order), :attr:`response_mask` (1
    for model tokens, 0 for appended ones), :attr:`response_logprobs` (the engine's log-probs,
    0.0 for appended tokens), :attr:`turns`, :attr:`segments` and the weight-version span;
    :meth:`to_dict` gives it as plain lists. ``session_id`` (a fresh uuid by default) goes on
    every request; ``sampling`` is the default of every turn.

    Agent code written with ``asyncio`` awaits :meth:`agenerate` instead: the blocking
    request runs on ``executor`` (a thread pool the caller sizes to the sessions it runs
    at once; ``None``: the event loop's default pool, which holds few threads).

    A session is used by one agent at a time: a second :meth:`generate` while a turn is in
    flight, or any change after :meth:`close`, is a :class:`~sc_rollout.SessionStateError`.
    :meth:`close` (or leaving a ``with`` block) aborts a turn in flight, whose tokens so far
    are kept.
    """

    def __init__(
        self,
        engine: RolloutEngine | Router,
        prompt_ids: Iterable[int],
        *,
        session_id: str | None = None,
        sampling: SamplingParams | None = None,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        if not callable(getattr(engine, "generate", None)):
            raise RolloutTypeError(
                "AgentSession(engine=...) takes a RolloutEngine or a Router, got "
                f"{type(engine).__name__}"
            )
        if session_id is None:
            session_id = uuid.uuid4().hex
        elif not isinstance(session_id, str):
            raise RolloutTypeError(
                f"AgentSession(session_id=...) must be a str, got {session_id!r} "
                f"({type(session_id).__name__})"
            )
        elif not session_id:
            raise RolloutRequestError("AgentSession(session_id=...) must not be empty")
        if sampling is None:
            sampling = SamplingParams()
        elif not isinstance(sampling, SamplingParams):
            raise RolloutTypeError(
                f"AgentSession(sampling=...) takes a SamplingParams, got {type(sampling).__name__}"
            )
        if executor is not None and not isinstance(executor, concurrent.futures.Executor):
            raise RolloutTypeError(
                "AgentSession(executor=...) takes a concurrent.futures.Executor, got "
                f"{type(executor).__name__}"
            )
        self._engine = engine
        self._executor = executor
        self._id = session_id
        self._sampling = sampling
        self._prompt = _tokens(prompt_ids, f"AgentSession {session_id}: prompt_ids")
        self._lock = threading.Lock()
        self._response: list[int] = []
        self._mask: list[int] = []
        self._logprobs: list[float] = []
        self._segments: list[Turn | AppendedTokens] = []
        self._turns = 0
        self._in_flight: str | None = None
        self._closed = False

    # --- the rollout so far -------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The id every request of the session carries."""
        return self._id

    @property
    def sampling(self) -> SamplingParams:
        """The sampling parameters of a turn that names none."""
        return self._sampling

    @property
    def in_flight(self) -> str | None:
        """The request id of the turn in flight, ``None`` when no turn runs."""
        with self._lock:
            return self._in_flight

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        """The initial prompt."""
        return self._prompt

    @property
    def response_ids(self) -> tuple[int, ...]:
        """Every token after the prompt, model and appended ones, in order."""
        with self._lock:
            return tuple(self._response)

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The whole sequence: ``prompt_ids + response_ids`` (the next turn's prompt)."""
        with self._lock:
            return self._prompt + tuple(self._response)

    @property
    def response_mask(self) -> tuple[int, ...]:
        """1 for each token of ``response_ids`` the model generated, 0 for appended ones."""
        with self._lock:
            return tuple(self._mask)

    @property
    def response_logprobs(self) -> tuple[float, ...]:
        """The engine's log-prob of each model token of ``response_ids``; 0.0 for appended
        tokens."""
        with self._lock:
            return tuple(self._logprobs)

    @property
    def segments(self) -> list[Turn | AppendedTokens]:
        """Every model turn and appended segment, in order."""
        with self._lock:
            return list(self._segments)

    @property
    def turns(self) -> list[Turn]:
        """The model turns, in order."""
        with self._lock:
            return [s for s in self._segments if isinstance(s, Turn)]

    @property
    def weight_version_min(self) -> int | None:
        """The lowest weight version any turn ran under (``None``: no turn yet)."""
        turns = self.turns
        return min((t.min_weight_version for t in turns), default=None)

    @property
    def weight_version_max(self) -> int | None:
        """The highest weight version any turn ran under (``None``: no turn yet)."""
        turns = self.turns
        return max((t.weight_version for t in turns), default=None)

    def to_dict(self) -> dict[str, Any]:
        """The rollout as plain values (what a trainer turns into a batch row): the session
        id, ``prompt_ids``, ``response_ids``, ``response_mask``, ``response_logprobs`` (lists),
        the weight-version span, whether any turn was aborted, and each segment's
        ``to_dict()``."""
        with self._lock:
            segments = list(self._segments)
            row: dict[str, Any] = {
                "session_id": self._id,
                "prompt_ids": list(self._prompt),
                "response_ids": list(self._response),
                "response_mask": list(self._mask),
                "response_logprobs": list(self._logprobs),
            }
        turns = [s for s in segments if isinstance(s, Turn)]
        row["weight_version_min"] = min((t.min_weight_version for t in turns), default=None)
        row["weight_version_max"] = max((t.weight_version for t in turns), default=None)
        row["aborted"] = any(t.aborted for t in turns)
        row["segments"] = [s.to_dict() for s in segments]
        return row

    # --- changes ------------------------------------------------------------------------------

    def generate(
        self, max_tokens: int | None = None, sampling: SamplingParams | None = None
    ) -> Turn:
        """Run one model turn: the whole sequence so far is the prompt of one request (id
        ``<session_id>-t<turn index>``), with ``sampling`` (the session's by default) and
        ``max_tokens`` (``sampling``'s by default). The generated tokens are appended as
        model tokens and the turn is returned.

        A sequence that no longer fits the engine's context is the engine's
        :class:`~sc_rollout.PromptTooLongError`, naming the session and the turn; the session
        is then unchanged. Other errors of the engine are raised as they are.
        """
        if sampling is None:
            sampling = self._sampling
        elif not isinstance(sampling, SamplingParams):
            raise RolloutTypeError(
                f"AgentSession {self._id}: generate(sampling=...) takes a SamplingParams, "
                f"got {type(sampling).__name__}"
            )
        if max_tokens is not None:
            check_int(max_tokens, f"AgentSession {self._id}: generate(max_tokens=...)", 1)
            sampling = dataclasses.replace(sampling, max_tokens=max_tokens)
        with self._lock:
            self._check_open("generate()")
            if self._in_flight is not None:
                raise SessionStateError(
                    f"AgentSession {self._id}: generate() while turn request "
                    f"{self._in_flight} is in flight; a session runs one turn at a time"
                )
            index = self._turns
            request = GenerateRequest(
                prompt_ids=self._prompt + tuple(self._response),
                sampling=sampling,
                request_id=f"{self._id}-t{index}",
                session_id=self._id,
            )
            self._in_flight = request.request_id
        try:
            result = self._engine.generate(request)
        except PromptTooLongError as exc:
            raise PromptTooLongError(
                f"AgentSession {self._id}, turn {index}: the sequence of "
                f"{len(request.prompt_ids)} tokens with max_tokens={sampling.max_tokens} does "
                f"not fit the engine's context: {exc}"
            ) from exc
        finally:
            with self._lock:
                self._in_flight = None
        return self._record(index, result, sampling.banned_token_ids)

    async def agenerate(
        self, max_tokens: int | None = None, sampling: SamplingParams | None = None
    ) -> Turn:
        """:meth:`generate` for agent code running in an event loop: the request runs on the
        session's executor while the loop serves other sessions. Cancelling the awaiting
        task does not stop the request; :meth:`close` aborts it."""
        call = functools.partial(self.generate, max_tokens, sampling)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _record(self, index: int, result: GenerateResult, banned: Iterable[int] = ()) -> Turn:
        with self._lock:
            low = result.min_weight_version
            turn = Turn(
                index=index,
                start=len(self._response),
                request_id=result.request_id,
                token_ids=result.token_ids,
                logprobs=result.logprobs,
                finish_reason=result.finish_reason,
                min_weight_version=result.weight_version if low is None else low,
                weight_version=result.weight_version,
                server=result.server,
                banned_token_ids=tuple(banned),
            )
            self._response.extend(turn.token_ids)
            self._mask.extend([1] * len(turn.token_ids))
            self._logprobs.extend(turn.logprobs)
            self._segments.append(turn)
            self._turns = index + 1
            return turn

    def append_tokens(self, token_ids: Iterable[int], *, role: str = "tool") -> AppendedTokens:
        """Append tokens the model did not generate (a tool's answer, a user's message):
        masked 0 in ``response_mask``, log-prob 0.0. Returns the segment's record."""
        if not isinstance(role, str) or not role:
            raise RolloutTypeError(
                f"AgentSession {self._id}: append_tokens(role=...) must be a non-empty str, "
                f"got {role!r}"
            )
        tokens = _tokens(token_ids, f"AgentSession {self._id}: append_tokens(token_ids)")
        with self._lock:
            self._check_open("append_tokens()")
            if self._in_flight is not None:
                raise SessionStateError(
                    f"AgentSession {self._id}: append_tokens() while turn request "
                    f"{self._in_flight} is in flight"
                )
            segment = AppendedTokens(role=role, start=len(self._response), token_ids=tokens)
            self._response.extend(tokens)
            self._mask.extend([0] * len(tokens))
            self._logprobs.extend([0.0] * len(tokens))
            self._segments.append(segment)
            return segment

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise SessionStateError(f"AgentSession {self._id}: {method} after close()")

    def close(self) -> None:
        """End the session: a turn in flight is aborted (its tokens so far are kept as an
        aborted turn; one whose request has not reached the engine yet runs to its end);
        later changes are a :class:`~sc_rollout.SessionStateError`. The rollout stays
        readable. Closing again does nothing."""
        with self._lock:
            self._closed = True
            in_flight = self._in_flight
        if in_flight is not None:
            self._engine.abort(in_flight)

    def __enter__(self) -> AgentSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        """The number of tokens so far, prompt included."""
        with self._lock:
            return len(self._prompt) + len(self._response)

    def __repr__(self) -> str:
        with self._lock:
            return (
                f"AgentSession({self._id!r}, prompt={len(self._prompt)} tokens, "
                f"response={len(self._response)} tokens, turns={self._turns}"
                f"{', closed' if self._closed else ''})"
            )
