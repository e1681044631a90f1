"""Chat templates and tool-call parsing for the OpenAI-compatible chat front.

A :class:`ChatTemplate` renders a conversation (OpenAI-style messages) to text and turns text
into token ids and back; :class:`HFChatTemplate` adapts a Hugging Face tokenizer (duck-typed:
nothing here imports transformers). A :class:`ToolCallParser` finds the tool calls in the text
a model generated; :class:`HermesToolCallParser` reads Hermes / Qwen style
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.

The delta rule (how a later request of a conversation becomes tokens) lives here too, in
:func:`new_messages_text` and :func:`end_of_turn`: the chat template is applied once per turn,
to the new messages only, and the tokens the engine generated are never re-tokenized.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .._errors import ChatTemplateError, RolloutRequestError, RolloutTypeError

__all__ = [
    "ChatTemplate",
    "HFChatTemplate",
    "HermesToolCallParser",
    "ToolCall",
    "ToolCallParser",
    "end_of_turn",
    "end_of_turn_overlap",
    "new_messages_text",
]

_log = logging.getLogger("sc_rollout.chat")

#: the content of the probe assistant message that :func:`end_of_turn` renders
_PROBE = "sc-rollout-end-of-turn-probe-5f0c2e"


@runtime_checkable
class ChatTemplate(Protocol):
    """What the chat front needs of a model's chat template and tokenizer.

    * :meth:`render` gives the text of ``messages`` (dicts in OpenAI's chat format, tool
      calls' ``arguments`` as parsed JSON objects, as Hugging Face templates expect), with
      ``tools`` (OpenAI's tool list, or ``None``) and, if ``add_generation_prompt``, the text
      that opens the next assistant message.
    * :meth:`encode` tokenizes a piece of text as it is, without adding special tokens (a
      BOS) of its own.
    * :meth:`decode` gives the text of token ids, special tokens included.
    """

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


class HFChatTemplate:
    """A Hugging Face tokenizer as a :class:`ChatTemplate`: ``render`` is
    ``tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=...,
    tokenize=False, **template_kwargs)``, ``encode`` is ``tokenizer.encode(text,
    add_special_tokens=False)``, ``decode`` keeps special tokens and spaces as they are.

    Duck-typed: any object with those three methods will do (transformers is never imported
    here). ``template_kwargs`` go to every ``apply_chat_template`` call (``chat_template=``
    to use another template, a template's own switches such as ``enable_thinking=False``). A
    template that raises (a ``raise_exception`` in its Jinja code, say) is a
    :class:`~sc_rollout.ChatTemplateError` carrying its message.
    """

    def __init__(self, tokenizer: Any, **template_kwargs: Any) -> None:
        for name in ("apply_chat_template", "encode", "decode"):
            if not callable(getattr(tokenizer, name, None)):
                raise RolloutTypeError(
                    f"HFChatTemplate(tokenizer=...) needs a tokenizer with {name}() (a "
                    f"transformers PreTrainedTokenizer), got {type(tokenizer).__name__}"
                )
        self._tokenizer = tokenizer
        self._kwargs = dict(template_kwargs)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer adapted."""
        return self._tokenizer

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        try:
            text = self._tokenizer.apply_chat_template(
                [dict(m) for m in messages],
                tools=[dict(t) for t in tools] if tools else None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self._kwargs,
            )
        except Exception as exc:
            raise ChatTemplateError(
                f"HFChatTemplate.render: the tokenizer's chat template failed on "
                f"{len(messages)} messages: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(text, str):
            raise ChatTemplateError(
                f"HFChatTemplate.render: apply_chat_template(tokenize=False) returned "
                f"{type(text).__name__}, not str"
            )
        return text

    def encode(self, text: str) -> list[int]:
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        return [int(i) for i in ids]

    def decode(self, token_ids: Sequence[int]) -> str:
        text = self._tokenizer.decode(
            list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if not isinstance(text, str):
            raise ChatTemplateError(
                f"HFChatTemplate.decode: tokenizer.decode returned {type(text).__name__}"
            )
        return text

    def __repr__(self) -> str:
        return f"HFChatTemplate({type(self._tokenizer).__name__})"


# --- tool calls -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant message: the function's ``name``, its ``arguments`` as
    a JSON string (OpenAI's form) and the call's ``id`` (the chat front assigns
    ``call_<session>_<turn>_<k>``; ``None`` before it does)."""

    name: str
    arguments: str
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's ``tool_calls`` entry: ``{"id", "type": "function", "function": {"name",
        "arguments"}}`` (no ``id`` while it is ``None``)."""
        entry: dict[str, Any] = {
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if self.id is not None:
            entry = {"id": self.id, **entry}
        return entry


@runtime_checkable
class ToolCallParser(Protocol):
    """Finds the tool calls in the text of one model turn (its end-of-turn marker already
    removed): returns the message's content (the text outside the calls, ``None`` if there
    is none) and the calls, in order, without ids. Text it cannot read as a call stays in the
    content; a parser does not raise on what a model wrote."""

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]: ...


class HermesToolCallParser:
    """Hermes / Qwen style tool calls: each ``<tool_call>JSON</tool_call>`` block whose JSON
    is an object with a non-empty string ``"name"`` and ``"arguments"`` (a JSON object, or a
    string holding one; absent means ``{}``) is a call; its arguments are re-serialized as a
    JSON string. The content is the text outside the calls, stripped of surrounding
    whitespace (``None`` if empty).

    A malformed block (invalid JSON, no name, arguments that are not an object) and an
    unclosed ``<tool_call>`` stay in the content as written, so the caller sees what the
    model produced. ``start`` and ``end`` change the markers.
    """

    def __init__(self, start: str = "<tool_call>", end: str = "</tool_call>") -> None:
        for label, marker in (("start", start), ("end", end)):
            if not isinstance(marker, str) or not marker:
                raise RolloutTypeError(
                    f"HermesToolCallParser({label}=...) must be a non-empty str, got {marker!r}"
                )
        self._start, self._end = start, end
        # a block holds no other start marker: an unclosed block does not swallow the next
        opening, closing = re.escape(start), re.escape(end)
        self._block = re.compile(f"{opening}((?:(?!{opening}).)*?){closing}", re.DOTALL)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        calls: list[ToolCall] = []
        kept: list[str] = []
        pos = 0
        for match in self._block.finditer(text):
            call = self._call(match.group(1))
            if call is None:
                continue  # the malformed block stays in the content
            kept.append(text[pos : match.start()])
            pos = match.end()
            calls.append(call)
        kept.append(text[pos:])
        content = "".join(kept).strip()
        return (content or None), calls

    def _call(self, inner: str) -> ToolCall | None:
        try:
            value = json.loads(inner.strip())
        except json.JSONDecodeError as exc:
            _log.debug("a %s block is not JSON (%s): kept as content", self._start, exc)
            return None
        if not isinstance(value, dict):
            return None
        name = value.get("name")
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            _log.debug("a %s block without a name or object arguments: kept", self._start)
            return None
        return ToolCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))

    def __repr__(self) -> str:
        return f"HermesToolCallParser({self._start!r}, {self._end!r})"


# --- the delta rule -------------------------------------------------------------------------


def _render(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    add_generation_prompt: bool,
    where: str,
) -> str:
    text = template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)
    if not isinstance(text, str):
        raise ChatTemplateError(f"{where}: the template rendered {type(text).__name__}, not str")
    return text


def _divergence(old: str, new: str) -> int:
    """The first offset where ``old`` and ``new`` differ."""
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            return i
    return min(len(old), len(new))


def new_messages_text(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    answered: int,
    tools: Sequence[Mapping[str, Any]] | None,
    where: str,
) -> str:
    """The text of ``messages[answered:]`` plus the generation prompt, as the template
    renders it after ``messages[:answered]`` (which end with the last assistant message).

    ``render(messages, add_generation_prompt=True)`` must start with
    ``render(messages[:answered], add_generation_prompt=False)``; the text is what follows.
    A template that renders the earlier conversation differently once new messages follow
    (one that drops an earlier turn's reasoning, say) is a
    :class:`~sc_rollout.ChatTemplateError` naming ``where`` and the offset where they part.
    """
    if not 0 < answered <= len(messages):
        raise RolloutRequestError(
            f"{where}: answered must be in 1..{len(messages)}, got {answered}"
        )
    old = _render(template, messages[:answered], tools, False, where)
    new = _render(template, messages, tools, True, where)
    if not new.startswith(old):
        at = _divergence(old, new)
        raise ChatTemplateError(
            f"{where}: the template renders the conversation so far differently once "
            f"{len(messages) - answered} new message(s) follow; they part at character {at}: "
            f"before {old[max(0, at - 30) : at + 30]!r}, now {new[max(0, at - 30) : at + 30]!r}"
            " (the recorded tokens would no longer be the template's; start a new session)"
        )
    return new[len(old) :]


def end_of_turn(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    where: str,
) -> str:
    """The text the template puts after an assistant message's content when that message
    follows ``messages`` (ChatML: ``"<|im_end|>\\n"``): found by rendering a probe
    assistant message. A template that does not render the probe's content as given is a
    :class:`~sc_rollout.ChatTemplateError`."""
    probe = [*messages, {"role": "assistant", "content": _PROBE}]
    text = _render(template, probe, tools, False, where)
    at = text.rfind(_PROBE)
    if at < 0:
        raise ChatTemplateError(
            f"{where}: the template does not render an assistant message's content as given "
            "(its end of turn cannot be found); the chat front needs one that does"
        )
    return text[at + len(_PROBE) :]


def end_of_turn_overlap(generated: str, end: str) -> int:
    """How many leading characters of ``end`` (the template's end of turn) ``generated``
    ends with: the part of the end of turn the model generated itself."""
    for size in range(min(len(end), len(generated)), 0, -1):
        if generated.endswith(end[:size]):
            return size
    return 0
