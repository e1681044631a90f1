"""The rollout-engine contract: what every engine (the toy engine, vLLM's, sc-workers'
built-in one) and every client of an engine server (:class:`~sc_rollout.RolloutClient`)
provides, so that a server, a router and a trainer can hold any of them."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ._types import EngineHealth, GenerateRequest, GenerateResult, WeightUpdate

__all__ = ["RolloutEngine"]


@runtime_checkable
class RolloutEngine(Protocol):
    """A generation engine, token ids in and token ids out.

    Every method may be called from several threads at once; :meth:`generate` blocks its
    caller until the request ends (many run concurrently).

    * :meth:`generate` samples a completion; the result carries the log-probability of each
      token and the weight version(s) it ran under. A prompt that does not fit with its
      ``max_tokens`` is a :class:`~sc_rollout.PromptTooLongError`.
    * :meth:`abort` ends a request in flight: its :meth:`generate` returns at once with the
      tokens so far and ``finish_reason="abort"``. ``True`` if it was in flight.
    * :meth:`pause` holds every request between two tokens (new ones wait before their
      first) until :meth:`resume`; abort and weight loads still work while paused.
    * :meth:`load_weights` takes new weights at a version (not below the current one; the
      same version again reloads) and returns the version now held; requests in flight
      continue on the new weights from their next token.
    * :meth:`health` reports the engine's state; :meth:`weight_version` its version.
    * :meth:`sleep` frees the engine's memory (level 1: keep the weights somewhere cheap;
      2: drop them, :meth:`wake_up` reloads the current version); generate while asleep is
      an :class:`~sc_rollout.EngineStateError`.
    """

    def generate(self, request: GenerateRequest) -> GenerateResult: ...

    def abort(self, request_id: str) -> bool: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def load_weights(self, update: WeightUpdate) -> int: ...

    def weight_version(self) -> int: ...

    def health(self) -> EngineHealth: ...

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self) -> None: ...
