"""The parts of an OpenAI chat-completions request: its messages and tools, checked and put
in one canonical form (so that the assistant message a client echoes back compares equal to
the one the chat front returned), its sampling parameters and its session id."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import RolloutRequestError, RolloutTypeError, ScRolloutError
from ..engines._types import SamplingParams
from ._chat import ToolCall

__all__ = [
    "ChatMessage",
    "parse_messages",
    "parse_tools",
    "roles",
    "sampling_of",
    "session_id_of",
]

_ROLES = ("system", "developer", "user", "assistant", "tool")


def _arguments(arguments: str) -> Any:
    """A tool call's arguments as the template sees them: the parsed JSON object (what Hugging
    Face templates expect), or the string as it is when it is not one."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


@dataclass(frozen=True)
class ChatMessage:
    """One message in canonical form: empty content is ``None``; a list of text parts is
    their text joined by newlines; tool calls as :class:`~sc_rollout.ToolCall` (arguments a
    JSON string). Fields outside OpenAI's core (``refusal``, ``annotations``, ...) are
    dropped."""

    role: str
    content: str | None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template takes it: content a str, tool-call arguments
        parsed."""
        out: dict[str, Any] = {"role": self.role, "content": self.content or ""}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _arguments(call.arguments)},
                }
                for call in self.tool_calls
            ]
        return out

    def to_openai(self) -> dict[str, Any]:
        """The message in OpenAI's chat format (``tool_calls`` only when there are some)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        return out


def _str(value: object, where: str, *, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise RolloutTypeError(f"{where} must be a non-empty str, got {value!r}")
    return value


def _content(value: object, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, list):
        texts: list[str] = []
        for i, part in enumerate(value):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise RolloutRequestError(
                    f"{where}[{i}]: only text parts are supported, got {part!r:.80}"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise RolloutTypeError(f"{where}[{i}].text must be a str, got {text!r}")
            texts.append(text)
        return "\n".join(texts) or None
    raise RolloutTypeError(
        f"{where} must be a str, a list of text parts or null, got {type(value).__name__}"
    )


def _tool_call(value: object, where: str) -> ToolCall:
    if not isinstance(value, Mapping):
        raise RolloutTypeError(f"{where} must be an object, got {value!r:.80}")
    if value.get("type", "function") != "function":
        raise RolloutRequestError(f"{where}.type must be 'function', got {value['type']!r}")
    function = value.get("function")
    if not isinstance(function, Mapping):
        raise RolloutTypeError(f"{where}.function must be an object, got {function!r:.80}")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, Mapping):
        arguments = json.dumps(dict(arguments), ensure_ascii=False)
    if not isinstance(arguments, str):
        raise RolloutTypeError(
            f"{where}.function.arguments must be a JSON string, got {arguments!r:.80}"
        )
    return ToolCall(
        name=str(_str(function.get("name"), f"{where}.function.name", required=True)),
        arguments=arguments,
        id=_str(value.get("id"), f"{where}.id", required=True),
    )


def _message(value: object, where: str) -> ChatMessage:
    if not isinstance(value, Mapping):
        raise RolloutTypeError(f"{where} must be an object, got {value!r:.80}")
    role = value.get("role")
    if role not in _ROLES:
        raise RolloutRequestError(f"{where}.role must be one of {_ROLES}, got {role!r}")
    calls: tuple[ToolCall, ...] = ()
    raw_calls = value.get("tool_calls")
    if raw_calls is not None:
        if role != "assistant":
            raise RolloutRequestError(f"{where}: only an assistant message has tool_calls")
        if not isinstance(raw_calls, list):
            raise RolloutTypeError(f"{where}.tool_calls must be a list, got {raw_calls!r:.80}")
        calls = tuple(_tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(raw_calls))
    tool_call_id = _str(value.get("tool_call_id"), f"{where}.tool_call_id", required=role == "tool")
    return ChatMessage(
        role=str(role),
        content=_content(value.get("content"), f"{where}.content"),
        name=_str(value.get("name"), f"{where}.name"),
        tool_call_id=tool_call_id,
        tool_calls=calls,
    )


def parse_messages(value: object, where: str) -> tuple[ChatMessage, ...]:
    """The request's ``messages``: a non-empty list of chat messages (roles system,
    developer, user, assistant, tool; a tool message needs its ``tool_call_id``)."""
    if not isinstance(value, list):
        raise RolloutTypeError(
            f"{where}: 'messages' must be a list of chat messages, got {value!r:.80}"
        )
    if not value:
        raise RolloutRequestError(f"{where}: 'messages' must hold at least one message")
    return tuple(_message(m, f"{where}: messages[{i}]") for i, m in enumerate(value))


def _tool(value: object, where: str) -> dict[str, Any]:
    """One of the request's tools: OpenAI's function tool, ``{"type": "function",
    "function": {"name": ..., "parameters": {...}, ...}}`` (``type`` may be left out)."""
    if not isinstance(value, Mapping):
        raise RolloutTypeError(f"{where} must be an object, got {value!r:.80}")
    if value.get("type", "function") != "function":
        raise RolloutRequestError(
            f"{where}.type must be 'function' (the only tools served), got {value['type']!r:.80}"
        )
    function = value.get("function")
    if not isinstance(function, Mapping):
        raise RolloutTypeError(f"{where}.function must be an object, got {function!r:.80}")
    _str(function.get("name"), f"{where}.function.name", required=True)
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise RolloutTypeError(
            f"{where}.function.parameters must be an object (a JSON schema), got {parameters!r:.80}"
        )
    return dict(value)


def parse_tools(value: object, where: str) -> tuple[list[dict[str, Any]] | None, str]:
    """The request's ``tools`` (a list of OpenAI function tools, each with a
    ``function.name``, passed to the template as they are; ``None`` when absent or empty)
    and a key that compares them."""
    if value is None or value == []:
        return None, ""
    if not isinstance(value, list):
        raise RolloutTypeError(f"{where}: 'tools' must be a list of objects, got {value!r:.80}")
    tools = [_tool(t, f"{where}: tools[{i}]") for i, t in enumerate(value)]
    return tools, json.dumps(tools, sort_keys=True, default=repr)


def roles(messages: Sequence[ChatMessage]) -> str:
    """The roles of ``messages``, each once, in order, joined by ``+`` (``"tool"``,
    ``"tool+user"``); ``"template"`` when there are none."""
    return "+".join(dict.fromkeys(m.role for m in messages)) or "template"


def sampling_of(body: Mapping[str, Any], default: SamplingParams, where: str) -> SamplingParams:
    """``default`` with the request's ``max_completion_tokens`` (else ``max_tokens``),
    ``temperature``, ``top_p``, ``seed`` and ``stop_token_ids`` (vLLM's extension) where
    given; :class:`~sc_rollout.SamplingParams` checks them."""
    changes: dict[str, Any] = {}
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    if limit is not None:
        changes["max_tokens"] = limit
    for key in ("temperature", "top_p", "seed", "stop_token_ids"):
        if body.get(key) is not None:
            changes[key] = body[key]
    try:
        return dataclasses.replace(default, **changes)
    except ScRolloutError as exc:
        raise type(exc)(f"{where}: {exc}") from None


def session_id_of(body_id: object, header_id: object, where: str) -> str | None:
    """The session a request names: the body's ``session_id`` or the ``X-Session-Id``
    header (both given, they must agree); ``None`` when it names none."""
    for label, value in (("body field session_id", body_id), ("X-Session-Id", header_id)):
        if value is not None and (not isinstance(value, str) or not value):
            raise RolloutTypeError(f"{where}: {label} must be a non-empty str, got {value!r}")
    if body_id is not None and header_id is not None and body_id != header_id:
        raise RolloutRequestError(
            f"{where}: session_id {body_id!r} in the body and X-Session-Id {header_id!r} differ"
        )
    chosen = body_id if body_id is not None else header_id
    return chosen if isinstance(chosen, str) else None
