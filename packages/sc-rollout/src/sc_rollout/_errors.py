"""The exceptions sc-rollout raises.

Every error is raised explicitly (never through ``assert``). Each class subclasses
:class:`ScRolloutError` and exactly one builtin exception, the one it means, so callers may
catch either::

    ScRolloutError (Exception)                 base class of everything below
    ├── RolloutRequestError (ValueError)       a call an engine cannot serve with the values
    │   │                                      given: bad sampling parameters, an empty
    │   │                                      prompt, a token id outside the vocabulary, a
    │   │                                      request id already in flight, n > 1, stream,
    │   │                                      a model the server does not serve, an HTTP
    │   │                                      body that cannot be read (its length, its
    │   │                                      size, its depth), a session id an agent loop
    │   │                                      still holds
    │   ├── PromptTooLongError                 the prompt and max_tokens do not fit in the
    │   │                                      engine's context length
    │   ├── ChatTemplateError                  a chat template that renders a conversation's
    │   │                                      earlier messages differently once new ones
    │   │                                      follow (the point where they part), or fails
    │   └── ChatHistoryError                   a chat request naming a session whose
    │                                          messages do not extend the session's recorded
    │                                          ones (the first message that differs)
    ├── RolloutTypeError (TypeError)           a value of the wrong type: a token id or a
    │                                          weight version that is not an int, a body
    │                                          that is not a JSON object
    ├── WeightVersionError (ValueError)        a weight version below 0, or below the version
    │                                          the engine (or the router) already holds
    ├── WeightLoadError (OSError)              the weights at a path could not be read
    ├── WeightMismatchError (ValueError)       a weight push whose tensor names or shapes do
    │                                          not match the engine's model (nothing loaded)
    ├── UnservableModelError (ValueError)      a model the engine cannot serve (its
    │                                          architecture, head size or dtype), with the
    │                                          engine's reason
    ├── EngineNotInstalledError (ImportError)  an engine asked for whose environment is not
    │                                          installed (the message names the command)
    ├── EngineStateError (RuntimeError)        a call the engine's state forbids: generate
    │                                          while it sleeps, sleep while requests run
    ├── RolloutConfigError (ValueError)        a bad constructor argument: a vocabulary of
    │   │                                      one token, a negative delay, a host meaning
    │   │                                      all interfaces, a URL that is not http://
    │   └── DuplicateServerError               a server added to a router twice (its name)
    ├── UnknownServerError (KeyError)          a router asked about a server it does not hold
    ├── UnknownSessionError (KeyError)         a chat front asked for a session it does not
    │                                          hold
    ├── ServerUnavailableError                 a server could not be reached: connection
    │   (ConnectionError)                      refused or reset, closed before it answered
    ├── RolloutServerError (RuntimeError)      a server answered with an error that has no
    │                                          typed counterpart, or with a malformed body; a
    │                                          server process that exited before it was ready
    ├── NoLiveServerError (RuntimeError)       a router found no live server for a request
    │                                          within its wait, or ran out of attempts
    ├── RouterClosedError (RuntimeError)       a router used after ``close()``
    ├── SessionStateError (RuntimeError)       an agent session changed after ``close()``,
    │                                          or while one of its turns is in flight (a
    │                                          chat request for a session that has one)
    ├── AgentLoopClosedError (RuntimeError)    an agent loop used after ``close()``
    └── RolloutTimeoutError (TimeoutError)     a request, health check or server start that
                                               passed its deadline

Messages name the method (or endpoint), the server and the offending value. The errors an
engine raises travel over HTTP by name (``{"error": {"type": ..., "message": ...}}``) and
:class:`~sc_rollout.RolloutClient` raises the same class again on the caller's side.
"""

from __future__ import annotations

__all__ = [
    "AgentLoopClosedError",
    "ChatHistoryError",
    "ChatTemplateError",
    "DuplicateServerError",
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
    "EngineNotInstalledError",
    "UnservableModelError",
    "WeightLoadError",
    "WeightMismatchError",
    "WeightVersionError",
]


class ScRolloutError(Exception):
    """Base class of every error raised by sc-rollout."""


class RolloutRequestError(ScRolloutError, ValueError):
    """A call an engine cannot serve with the values given (sampling parameters, prompt,
    request id, options the server does not support)."""


class PromptTooLongError(RolloutRequestError):
    """The prompt plus ``max_tokens`` do not fit in the engine's context length."""


class ChatTemplateError(RolloutRequestError):
    """A chat template that renders the earlier messages of a conversation differently once
    new messages follow (the recorded tokens would no longer be the template's), that fails
    on a conversation, or that does not render an assistant message's content as given."""


class ChatHistoryError(RolloutRequestError):
    """A chat request for a named session whose messages (or tools) do not extend the ones
    the session recorded: history edited or dropped, or a retry of an earlier request."""


class RolloutTypeError(ScRolloutError, TypeError):
    """A value of the wrong type (a token id, a weight version, a JSON body)."""


class WeightVersionError(ScRolloutError, ValueError):
    """A weight version below 0, or below the version already held."""


class WeightLoadError(ScRolloutError, OSError):
    """Weights at a path that could not be read."""


class WeightMismatchError(ScRolloutError, ValueError):
    """A weight push whose tensor names or shapes do not match the engine's model; the
    engine keeps the weights it had."""


class UnservableModelError(ScRolloutError, ValueError):
    """A model the engine cannot serve; the message carries the engine's own reason."""


class EngineNotInstalledError(ScRolloutError, ImportError):
    """An engine whose environment is not installed; the message names the command that
    installs it."""


class EngineStateError(ScRolloutError, RuntimeError):
    """A call the engine's state forbids (generate while asleep, sleep while busy)."""


class RolloutConfigError(ScRolloutError, ValueError):
    """A bad argument to an sc-rollout constructor."""


class DuplicateServerError(RolloutConfigError):
    """A server added to a router under a name it already holds."""


class UnknownServerError(ScRolloutError, KeyError):
    """A server name the router does not hold."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownSessionError(ScRolloutError, KeyError):
    """A session id the chat front does not hold (never seen, or already popped)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ServerUnavailableError(ScRolloutError, ConnectionError):
    """A server that could not be reached (refused, reset, closed before answering)."""


class RolloutServerError(ScRolloutError, RuntimeError):
    """A server's error without a typed counterpart, a malformed answer, or a server process
    that exited before it was ready."""


class NoLiveServerError(ScRolloutError, RuntimeError):
    """No live server answered a request within the router's wait or attempts."""


class RouterClosedError(ScRolloutError, RuntimeError):
    """A router used after ``close()``."""


class SessionStateError(ScRolloutError, RuntimeError):
    """An agent session changed after ``close()``, or while one of its turns is in
    flight."""


class AgentLoopClosedError(ScRolloutError, RuntimeError):
    """An agent loop used after ``close()``."""


class RolloutTimeoutError(ScRolloutError, TimeoutError):
    """A request, health check or server start that passed its deadline."""
