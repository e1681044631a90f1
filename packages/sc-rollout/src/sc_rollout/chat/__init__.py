"""An OpenAI-compatible chat-completions front over token-level agent sessions.

:class:`ChatFront` (and :class:`ChatServer`, the front over HTTP) takes chat-completions
requests, tool calls in the request and the answer, and records each conversation as an
:class:`~sc_rollout.agents.AgentSession`, applying the chat template (:class:`ChatTemplate`,
:class:`HFChatTemplate`) once per turn to the new messages only; tool calls are read by a
:class:`ToolCallParser` (:class:`HermesToolCallParser` by default) into :class:`ToolCall`.
"""

from __future__ import annotations

from sc_dispatch import _public

from ._chat import ChatTemplate, HermesToolCallParser, HFChatTemplate, ToolCall, ToolCallParser
from ._chat_front import ChatFront
from ._chat_server import ChatServer

__all__ = [
    "ChatFront",
    "ChatServer",
    "ChatTemplate",
    "HFChatTemplate",
    "HermesToolCallParser",
    "ToolCall",
    "ToolCallParser",
]

_public.publish(globals())
