"""``ChatFront``: OpenAI chat-completions requests as the turns of recorded agent sessions.

Each conversation is one :class:`~sc_rollout.AgentSession`. The first request's messages are
rendered by the chat template (with the generation prompt) and tokenized: the session's
prompt. Each later request appends, as tokens the model did not generate (mask 0), only the
text the template renders for its *new* messages plus the generation prompt (see
:func:`~sc_rollout._chat.new_messages_text`), after the part of the template's end of turn
that the model did not generate itself. The assistant tokens the engine generated are never
re-tokenized: the session's tokens are the engine's tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from .._errors import (
    ChatHistoryError,
    ChatTemplateError,
    RolloutConfigError,
    RolloutRequestError,
    RolloutTypeError,
    SessionStateError,
    UnknownSessionError,
)
from ..agents._session import AgentSession
from ..engines._engine import RolloutEngine
from ..engines._types import SamplingParams
from ..routing._router import Router
from ._chat import (
    ChatTemplate,
    HermesToolCallParser,
    ToolCall,
    ToolCallParser,
    end_of_turn,
    end_of_turn_overlap,
    new_messages_text,
)
from ._chat_messages import (
    ChatMessage,
    parse_messages,
    parse_tools,
    roles,
    sampling_of,
    session_id_of,
)

__all__ = ["ChatFront"]

_log = logging.getLogger("sc_rollout.chat")


class _Entry:
    """A conversation's session and what it recorded (changed under the front's lock, by the
    one request that holds it ``busy``)."""

    __slots__ = ("bridge", "busy", "id", "messages", "pending", "session", "tools_key")

    def __init__(self, session_id: str, tools_key: str) -> None:
        self.id = session_id
        self.tools_key = tools_key
        self.session: AgentSession | None = None
        #: the conversation answered so far (it ends with the assistant message returned)
        self.messages: tuple[ChatMessage, ...] = ()
        #: a request whose prompt tokens are in the session but whose turn failed
        self.pending: tuple[ChatMessage, ...] | None = None
        #: the part of the template's end of turn the model did not generate
        self.bridge = ""
        self.busy = False

    def extends(self, messages: tuple[ChatMessage, ...], tools_key: str) -> bool:
        if tools_key != self.tools_key:
            return False
        if self.pending is not None:
            return messages == self.pending
        return messages[: len(self.messages)] == self.messages

    def mismatch(self, messages: tuple[ChatMessage, ...], tools_key: str) -> str:
        """Why ``messages`` do not extend the session (for the error)."""
        if tools_key != self.tools_key:
            return "the request's tools differ from the ones the session started with"
        if self.pending is not None:
            return (
                f"it holds the prompt of an unanswered request of {len(self.pending)} "
                "messages; only that request may be sent again"
            )
        if len(messages) < len(self.messages):
            return (
                f"the request has {len(messages)} messages, fewer than the "
                f"{len(self.messages)} the session recorded"
            )
        pairs = zip(self.messages, messages, strict=False)
        at = next((i for i, (a, b) in enumerate(pairs) if a != b), 0)
        return (
            f"messages[{at}] ({messages[at].role}: {messages[at].content!r:.60}) differs from "
            f"the recorded one ({self.messages[at].role}: {self.messages[at].content!r:.60})"
        )


class ChatFront:
    """OpenAI chat completions on ``engine`` (a :class:`~sc_rollout.RolloutEngine` or a
    :class:`~sc_rollout.Router`), each conversation recorded as an
    :class:`~sc_rollout.AgentSession` for training.

    ``template`` (a :class:`~sc_rollout.ChatTemplate`, e.g. :class:`~sc_rollout.HFChatTemplate`)
    renders and tokenizes; ``parser`` (a :class:`~sc_rollout.ToolCallParser`,
    :class:`~sc_rollout.HermesToolCallParser` by default) reads tool calls from a turn of a
    request that has ``tools``; ``sampling`` is the default of every turn (the request's
    ``max_completion_tokens`` / ``max_tokens``, ``temperature``, ``top_p``, ``seed`` and
    ``stop_token_ids`` override it); ``model`` is the name served (the engine's by default;
    a router has none, so give it).

    :meth:`complete` maps a request to a session: an explicit id (the body's ``session_id``,
    ``extra_body={"session_id": ...}`` with the openai client, or the ``X-Session-Id``
    header) names it (a new session if unknown); otherwise the session whose recorded
    messages, the returned assistant messages included, are a prefix of the request's (the
    longest; the earliest on a tie) with the same tools continues; otherwise a new session
    starts. Sessions stay until :meth:`pop_session` or :meth:`close_session`. Thread-safe:
    conversations run concurrently; one conversation sends one request at a time.

    The template is applied once per turn, by token concatenation. The first request's
    messages, rendered with the generation prompt, are the session's prompt. A later request
    appends (mask 0) the tokens of: the part of the template's end of turn the model did not
    generate (``"\n"`` after a generated ``<|im_end|>``; all of ``"<|im_end|>\n"`` for a turn
    that did not end on a stop token), then ``new[len(old):]``, where ``old`` renders the
    recorded messages and ``new`` the request's with the generation prompt; ``new`` not
    starting with ``old`` is a :class:`~sc_rollout.ChatTemplateError`. The engine's tokens
    are never re-tokenized. The answer's content is the turn's text without the end of turn
    it generated.
    """

    def __init__(
        self,
        engine: RolloutEngine | Router,
        template: ChatTemplate,
        *,
        parser: ToolCallParser | None = None,
        sampling: SamplingParams | None = None,
        model: str | None = None,
    ) -> None:
        if not callable(getattr(engine, "generate", None)):
            raise RolloutTypeError(
                f"ChatFront(engine=...) takes a RolloutEngine or a Router, got "
                f"{type(engine).__name__}"
            )
        if not isinstance(template, ChatTemplate):
            raise RolloutTypeError(
                "ChatFront(template=...) takes a ChatTemplate (render, encode, decode), got "
                f"{type(template).__name__}"
            )
        if parser is None:
            parser = HermesToolCallParser()
        elif not isinstance(parser, ToolCallParser):
            raise RolloutTypeError(
                f"ChatFront(parser=...) takes a ToolCallParser, got {type(parser).__name__}"
            )
        if sampling is None:
            sampling = SamplingParams()
        elif not isinstance(sampling, SamplingParams):
            raise RolloutTypeError(
                f"ChatFront(sampling=...) takes a SamplingParams, got {type(sampling).__name__}"
            )
        if model is None:
            if not isinstance(engine, RolloutEngine):
                raise RolloutConfigError(
                    f"ChatFront: give model=... (the name clients ask for) for a "
                    f"{type(engine).__name__}, which does not report one"
                )
            model = engine.health().model
        elif not isinstance(model, str) or not model:
            raise RolloutTypeError(f"ChatFront(model=...) must be a non-empty str, got {model!r}")
        self._engine = engine
        self._template = template
        self._parser = parser
        self._sampling = sampling
        self._model = model
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    @property
    def model(self) -> str:
        """The model name served (a request naming another is refused)."""
        return self._model

    @property
    def template(self) -> ChatTemplate:
        return self._template

    @property
    def sampling(self) -> SamplingParams:
        """The sampling parameters of a request that names none."""
        return self._sampling

    # --- the recorded sessions -----------------------------------------------------------------

    def sessions(self) -> list[AgentSession]:
        """Every session held, in the order they started (one in its first turn included)."""
        with self._lock:
            return [e.session for e in self._entries.values() if e.session is not None]

    def _held(self, session_id: str, method: str) -> tuple[_Entry, AgentSession]:
        """The entry of ``session_id`` and its session (called under the lock)."""
        entry = self._entries.get(session_id)
        if entry is None or entry.session is None:
            raise UnknownSessionError(
                f"ChatFront.{method}: no session {session_id!r} (it holds "
                f"{len(self._entries)}; a popped session is no longer held)"
            )
        return entry, entry.session

    def session(self, session_id: str) -> AgentSession:
        """The session ``session_id`` (a :class:`~sc_rollout.UnknownSessionError` if not
        held)."""
        with self._lock:
            return self._held(session_id, "session()")[1]

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        """The conversation recorded for ``session_id``, in OpenAI's format, up to and with
        the last assistant message returned."""
        with self._lock:
            entry = self._held(session_id, "messages()")[0]
            return [m.to_openai() for m in entry.messages]

    def pop_session(self, session_id: str) -> AgentSession:
        """Take ``session_id`` out (a trainer takes a finished conversation); a later request
        of the conversation starts a new session. A turn in flight still completes into the
        session returned."""
        with self._lock:
            session = self._held(session_id, "pop_session()")[1]
            del self._entries[session_id]
        return session

    def close_session(self, session_id: str) -> AgentSession:
        """:meth:`pop_session`, then close the session (a turn in flight is aborted and
        kept)."""
        session = self.pop_session(session_id)
        session.close()
        return session

    def __len__(self) -> int:
        """The number of sessions held."""
        with self._lock:
            return len(self._entries)

    def __repr__(self) -> str:
        return f"ChatFront(model={self._model!r}, sessions={len(self)})"

    # --- a request -------------------------------------------------------------------------------

    def complete(self, body: Mapping[str, Any], *, session_id: str | None = None) -> dict[str, Any]:
        """Answer one chat-completions request ``body`` (OpenAI's JSON object) as one turn of
        its conversation's session; ``session_id`` is the ``X-Session-Id`` header, if any.

        Returns OpenAI's ``chat.completion`` object, plus ``sc_session_id``, ``sc_turn`` and
        the turn's weight versions. ``n`` > 1, ``stream``, ``stop`` strings, another model's
        name and malformed messages are :class:`~sc_rollout.RolloutRequestError` /
        :class:`~sc_rollout.RolloutTypeError`; a named session whose messages do not extend
        its recorded ones a :class:`~sc_rollout.ChatHistoryError`; a template that renders
        the conversation so far differently once new messages follow a
        :class:`~sc_rollout.ChatTemplateError`; a session with a request in flight a
        :class:`~sc_rollout.SessionStateError`.
        """
        where = "ChatFront.complete"
        if not isinstance(body, Mapping):
            raise RolloutTypeError(f"{where}: the body must be a JSON object, got {body!r:.80}")
        if body.get("n") not in (None, 1):
            raise RolloutRequestError(f"{where}: n must be 1, got {body['n']!r}")
        if body.get("stream") not in (None, False):
            raise RolloutRequestError(f"{where}: stream is not supported, got {body['stream']!r}")
        if body.get("stop"):
            raise RolloutRequestError(
                f"{where}: 'stop' strings are not supported, got {body['stop']!r:.60}; send "
                "stop_token_ids (extra_body) instead"
            )
        model = body.get("model")
        if model is not None and model != self._model:
            raise RolloutRequestError(
                f"{where}: model {model!r} is not served here; {self._model!r} is"
            )
        messages = parse_messages(body.get("messages"), where)
        tools, tools_key = parse_tools(body.get("tools"), where)
        use_parser = tools is not None and body.get("tool_choice") != "none"
        sampling = sampling_of(body, self._sampling, where)
        explicit = session_id_of(body.get("session_id"), session_id, where)

        entry, created = self._claim(explicit, messages, tools_key, where)
        recorded_turns = 0 if entry.session is None else len(entry.session.turns)
        try:
            return self._turn(entry, messages, tools, use_parser, sampling)
        except BaseException:
            self._after_failure(entry, created, recorded_turns)
            raise
        finally:
            with self._lock:
                entry.busy = False

    def _claim(
        self,
        explicit: str | None,
        messages: tuple[ChatMessage, ...],
        tools_key: str,
        where: str,
    ) -> tuple[_Entry, bool]:
        """The session of the request, held busy; whether it is new."""
        with self._lock:
            created = False
            entry: _Entry | None
            if explicit is not None:
                entry = self._entries.get(explicit)
                if entry is not None and entry.busy:
                    raise SessionStateError(
                        f"{where}: session {explicit} has a request in flight; a conversation "
                        "sends one request at a time"
                    )
                if entry is not None and not entry.extends(messages, tools_key):
                    raise ChatHistoryError(
                        f"{where}: session {explicit}: the request does not continue the "
                        f"recorded conversation: {entry.mismatch(messages, tools_key)}"
                    )
            else:
                entry = None
                for candidate in self._entries.values():
                    if candidate.busy or not candidate.extends(messages, tools_key):
                        continue
                    if entry is None or len(candidate.messages) > len(entry.messages):
                        entry = candidate
            if entry is None:
                session_id = explicit if explicit is not None else uuid.uuid4().hex
                entry = self._entries[session_id] = _Entry(session_id, tools_key)
                created = True
            entry.busy = True
            return entry, created

    def _after_failure(self, entry: _Entry, created: bool, recorded_turns: int) -> None:
        """After a failed request: a new session without an answered turn is dropped, and so
        is one that generated a turn it could not record (it cannot be continued); otherwise
        the session keeps the request's prompt tokens for a retry of the same request."""
        session = entry.session
        unrecorded = session is not None and len(session.turns) > recorded_turns
        if (created and (session is None or not session.turns)) or unrecorded:
            with self._lock:
                if self._entries.get(entry.id) is entry:
                    del self._entries[entry.id]
            if unrecorded:
                _log.warning(
                    "ChatFront: session %s generated a turn it could not answer; dropped",
                    entry.id,
                )

    def _turn(
        self,
        entry: _Entry,
        messages: tuple[ChatMessage, ...],
        tools: list[dict[str, Any]] | None,
        use_parser: bool,
        sampling: SamplingParams,
    ) -> dict[str, Any]:
        where = f"ChatFront.complete (session {entry.id})"
        template = self._template
        rendered = [m.for_template() for m in messages]
        session = entry.session
        if session is None:
            text = template.render(rendered, tools=tools, add_generation_prompt=True)
            if not isinstance(text, str):
                raise ChatTemplateError(f"{where}: the template rendered a non-str")
            session = AgentSession(
                self._engine, template.encode(text), session_id=entry.id, sampling=self._sampling
            )
            with self._lock:
                entry.session, entry.pending = session, messages
        elif entry.pending is None:
            answered = len(entry.messages)
            text = entry.bridge + new_messages_text(template, rendered, answered, tools, where)
            ids = template.encode(text) if text else []
            if ids:
                session.append_tokens(ids, role=roles(messages[answered:]))
            with self._lock:
                entry.pending = messages
        end = end_of_turn(template, rendered, tools, where)
        before = len(session)
        turn = session.generate(sampling=sampling)

        generated = template.decode(turn.token_ids)
        size = end_of_turn_overlap(generated, end) if turn.finish_reason == "stop" else 0
        visible = generated[: len(generated) - size]
        calls: list[ToolCall] = []
        if use_parser:
            content, calls = self._parser.parse(visible)
        else:
            content = visible.strip() or None
        calls = [
            dataclasses.replace(call, id=f"call_{entry.id}_{turn.index}_{k}")
            for k, call in enumerate(calls)
        ]
        reply = ChatMessage("assistant", content, tool_calls=tuple(calls))
        with self._lock:
            entry.messages = (*messages, reply)
            entry.pending = None
            entry.bridge = end[size:]
        completion = len(turn.token_ids)
        return {
            "id": f"chatcmpl-{turn.request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self._model,
            "choices": [
                {
                    "index": 0,
                    "message": reply.to_openai(),
                    "finish_reason": "tool_calls" if calls else turn.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": before,
                "completion_tokens": completion,
                "total_tokens": before + completion,
            },
            "sc_session_id": entry.id,
            "sc_turn": turn.index,
            "weight_version": turn.weight_version,
            "min_weight_version": turn.min_weight_version,
        }
