"""Test doubles for code built on sc-rollout (what sc's own tests use; not needed to serve).

* :class:`ToyEngine` (configured by :class:`ToyEngineConfig`): the test and reference
  engine, a seeded sampler over a tiny vocabulary with an optional delay per token. Not a
  model. ``ServerProcess.toy(config)`` serves one in a process of its own.
* :class:`ScriptedChatEngine`: an engine for chat tests whose answer to a prompt is a
  function of the prompt's text, tokenized with a chat template and ended by a stop token,
  with log-probs a fixed function of each token and its position.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sc_dispatch import _public

from .chat._chat import ChatTemplate
from .engines._toy import ToyEngine, ToyEngineConfig
from .engines._types import EngineHealth, GenerateRequest, GenerateResult, WeightUpdate

__all__ = ["ScriptedChatEngine", "ToyEngine", "ToyEngineConfig"]


def _scripted_logprob(token: int, position: int) -> float:
    return -((token * 7 + position) % 13 + 1) / 10


class ScriptedChatEngine:
    """A rollout engine whose answer to a prompt is ``reply(prompt text)`` (the prompt
    decoded with ``template``), encoded with ``template``, followed by ``end_token_id`` and
    cut at ``max_tokens`` (finish reason "stop" when the last token is one of the request's
    stop tokens, "length" otherwise). Log-probs are ``logprob(token, position)``; ``fail``
    requests from now raise ``RuntimeError``. Keeps every request in :attr:`requests`;
    thread-safe; the weight version is always 0."""

    def __init__(
        self,
        template: ChatTemplate,
        end_token_id: int,
        reply: Callable[[str], str],
        *,
        fail: int = 0,
        logprob: Callable[[int, int], float] = _scripted_logprob,
        model: str = "scripted",
    ) -> None:
        self.template = template
        self.end_token_id = end_token_id
        self.reply = reply
        self.fail = fail
        self.logprob = logprob
        self.model = model
        self.requests: list[GenerateRequest] = []
        self._lock = threading.Lock()

    def generate(self, request: GenerateRequest) -> GenerateResult:
        with self._lock:
            self.requests.append(request)
            if self.fail:
                self.fail -= 1
                raise RuntimeError("the engine failed")
        text = self.reply(self.template.decode(request.prompt_ids))
        tokens = [*self.template.encode(text), self.end_token_id][: request.sampling.max_tokens]
        return GenerateResult(
            request_id=request.request_id,
            token_ids=tuple(tokens),
            logprobs=tuple(self.logprob(t, i) for i, t in enumerate(tokens)),
            finish_reason="stop" if tokens[-1] in request.sampling.stop_token_ids else "length",
            weight_version=0,
        )

    def abort(self, request_id: str) -> bool:
        return False

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def load_weights(self, update: WeightUpdate) -> int:
        return update.version

    def weight_version(self) -> int:
        return 0

    def health(self) -> EngineHealth:
        return EngineHealth(self.model, 100_000, 0, False, False, 0)

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self) -> None:
        pass


_public.publish(globals())
