"""Every error sc-rollout raises: :class:`ScRolloutError` and its subclasses.

Bad values: :class:`RolloutRequestError` (:class:`PromptTooLongError`,
:class:`ChatTemplateError`, :class:`ChatHistoryError`), :class:`RolloutTypeError`,
:class:`RolloutConfigError` (:class:`DuplicateServerError`). Weights:
:class:`WeightVersionError`, :class:`WeightLoadError`, :class:`WeightMismatchError`. Engines:
:class:`UnservableModelError`, :class:`EngineNotInstalledError`, :class:`EngineStateError`.
Servers and the router: :class:`ServerUnavailableError`, :class:`RolloutServerError`,
:class:`RolloutTimeoutError`, :class:`NoLiveServerError`, :class:`RouterClosedError`,
:class:`UnknownServerError`. Sessions: :class:`SessionStateError`,
:class:`AgentLoopClosedError`, :class:`UnknownSessionError` (the chat front's). An error
raised in a server crosses HTTP as itself. :class:`ScRolloutError` is also in
:mod:`sc_rollout`.
"""

from __future__ import annotations

from sc_dispatch import _public

from ._errors import (
    AgentLoopClosedError,
    ChatHistoryError,
    ChatTemplateError,
    DuplicateServerError,
    EngineNotInstalledError,
    EngineStateError,
    NoLiveServerError,
    PromptTooLongError,
    RolloutConfigError,
    RolloutRequestError,
    RolloutServerError,
    RolloutTimeoutError,
    RolloutTypeError,
    RouterClosedError,
    ScRolloutError,
    ServerUnavailableError,
    SessionStateError,
    UnknownServerError,
    UnknownSessionError,
    UnservableModelError,
    WeightLoadError,
    WeightMismatchError,
    WeightVersionError,
)

__all__ = [
    "AgentLoopClosedError",
    "ChatHistoryError",
    "ChatTemplateError",
    "DuplicateServerError",
    "EngineNotInstalledError",
    "EngineStateError",
    "NoLiveServerError",
    "PromptTooLongError",
    "RolloutConfigError",
    "RolloutRequestError",
    "RolloutServerError",
    "RolloutTimeoutError",
    "RolloutTypeError",
    "RouterClosedError",
    "ScRolloutError",
    "ServerUnavailableError",
    "SessionStateError",
    "UnknownServerError",
    "UnknownSessionError",
    "UnservableModelError",
    "WeightLoadError",
    "WeightMismatchError",
    "WeightVersionError",
]

_public.publish(globals())
