"""``TorchRolloutEngine``: a local Hugging Face causal LM behind the rollout-engine contract
(:class:`sc_rollout.RolloutEngine`), decoded by one scheduler thread with continuous
batching.

Callers of :meth:`~TorchRolloutEngine.generate` (any number of threads) queue their request
and wait. The scheduler thread runs decoding steps: each takes every active request (up to
``max_batch_size``; the others wait for a slot), runs one forward over their left-padded
sequences (no key/value cache: the models served are small, and a request that joins or
leaves changes nothing but the batch) and appends one token to each. New requests join at
the next step; finished and aborted ones leave.

Two locks: ``_model_lock`` is held while the weights are used (a step's forward) or changed
(a weight load, sleep, wake up), so new weights land between two steps; ``_cond`` guards the
queues and flags. Whoever needs both takes ``_model_lock`` first. The weight version
changes under both, so either is enough to read it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
from sc_rollout import GenerateRequest, GenerateResult, WeightUpdate
from sc_rollout.engines import EngineHealth, FinishReason
from sc_rollout.errors import (
    EngineStateError,
    PromptTooLongError,
    RolloutRequestError,
    RolloutTypeError,
    WeightLoadError,
    WeightVersionError,
)
from torch import Tensor

from .._errors import ConfigError
from ..models._hf import HFCausalLM, hf_text_config, load_hf_model
from ._config import TorchRolloutEngineConfig
from ._decode import Flight, next_logits, pick
from ._weights import WeightSpec, copy_into, free, read_weights, restore, snapshot

__all__ = ["TorchRolloutEngine"]

logger = logging.getLogger(__name__)

#: config attributes that give a model's context length, in the order they are tried
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")


def _context_length(config: Any, where: str) -> int:
    for key in _CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ConfigError(f"{where}: the model's config has none of {list(_CONTEXT_KEYS)}")


class TorchRolloutEngine:
    """The built-in rollout engine: the local Hugging Face causal LM of
    ``config.model`` (loaded as sc-workers' workers load it, in ``config.dtype`` on
    ``config.device``), behind :class:`sc_rollout.RolloutEngine`.

    * :meth:`generate` samples with each request's own seeded generator (temperature 0:
      greedy; otherwise temperature and top-p); every token's log-prob is the model's
      ``log_softmax`` of the raw logits at that token, float32, as a trainer recomputes it.
    * :meth:`load_weights` reads a safetensors file or a directory of them (names as
      ``save_pretrained`` writes them), checks every name and shape before it changes
      anything (a :class:`sc_rollout.errors.WeightMismatchError` lists what does not fit, and the
      engine keeps its weights), and applies them between two decoding steps.
    * :meth:`sleep` level 1 keeps a CPU copy of the weights and frees the model's tensors;
      level 2 drops them, and :meth:`wake_up` reads the current version's path again (the
      model directory for version 0).
    * :meth:`close` stops the scheduler thread; requests still in flight end as aborted.

    Needs the ``hf`` extra (``sc-workers[hf]``); without transformers the constructor raises
    :class:`~sc_workers.OptionalDependencyError`, and a directory that is not a model
    :class:`~sc_workers.ConfigError`.
    """

    def __init__(self, config: TorchRolloutEngineConfig) -> None:
        if not isinstance(config, TorchRolloutEngineConfig):
            raise RolloutTypeError(
                "TorchRolloutEngine(config=...) takes a TorchRolloutEngineConfig, got "
                f"{type(config).__name__}"
            )
        self._config = config
        self._name = config.model_name
        self._device = torch.device(config.device)
        module = self._load(config.model)
        module.to(self._device).eval()
        module.requires_grad_(False)
        self._model = module
        text = hf_text_config(module.hf_config)
        self._context = _context_length(text, f"TorchRolloutEngine({config.model!r})")
        self._vocab = int(text.vocab_size)
        self._spec = WeightSpec.of(module.model)
        self._model_lock = threading.Lock()
        self._cond = threading.Condition()
        self._version = 0
        self._weights_path = config.model
        self._snapshot: dict[str, Tensor] | None = None
        self._sleep_level = 0
        self._paused = False
        self._closed = False
        self._flights: dict[str, Flight] = {}
        self._waiting: deque[Flight] = deque()
        self._active: list[Flight] = []
        self._thread = threading.Thread(
            target=self._schedule, name=f"sc-torch-engine-{self._name}", daemon=True
        )
        self._thread.start()
        logger.info(
            "%s: serving %s on %s (context %d, vocabulary %d)",
            self._name,
            config.model,
            self._device,
            self._context,
            self._vocab,
        )

    def _load(self, path: str) -> HFCausalLM:
        config = self._config
        module = load_hf_model(path, False, config.torch_dtype, config.seed)
        if not isinstance(module, HFCausalLM):  # load_hf_model gives one without value_head
            raise ConfigError(f"{self._name}: {path!r} did not load as a causal LM")
        return module

    @property
    def config(self) -> TorchRolloutEngineConfig:
        """The engine's settings."""
        return self._config

    def __repr__(self) -> str:
        return f"TorchRolloutEngine({self._config!r}, weight_version={self._version})"

    def __enter__(self) -> TorchRolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- generation -------------------------------------------------------------------------

    def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample a completion of ``request`` (see :class:`sc_rollout.RolloutEngine`); blocks
        until it ends."""
        if not isinstance(request, GenerateRequest):
            raise RolloutTypeError(
                f"{self._name}: generate() takes a GenerateRequest, got {type(request).__name__}"
            )
        self._check(request)
        flight = Flight(request, self._device)
        rid = request.request_id
        with self._cond:
            if self._closed:
                raise EngineStateError(f"{self._name}: generate(request {rid}) after close()")
            if self._sleep_level:
                raise EngineStateError(
                    f"{self._name}: generate(request {rid}) while the engine sleeps; "
                    "call wake_up() first"
                )
            if rid in self._flights:
                raise RolloutRequestError(f"{self._name}: request id {rid!r} is already in flight")
            self._flights[rid] = flight
            self._waiting.append(flight)
            self._cond.notify_all()
        try:
            flight.done.wait()
        finally:
            with self._cond:
                flight.aborted = True  # a no-op once it ended; else its caller is gone
                del self._flights[rid]
                self._cond.notify_all()
        if flight.error is not None:
            raise flight.error
        if flight.result is None:  # done is only set with a result or an error
            raise EngineStateError(f"{self._name}: request {rid} ended without a result")
        return flight.result

    def _check(self, request: GenerateRequest) -> None:
        rid = request.request_id
        for position, token in enumerate(request.prompt_ids):
            if token >= self._vocab:
                raise RolloutRequestError(
                    f"{self._name}: request {rid}: prompt token id {token} at position "
                    f"{position} is outside the vocabulary of {self._vocab} tokens "
                    f"(0..{self._vocab - 1})"
                )
        length = len(request.prompt_ids)
        need = length + request.sampling.max_tokens
        if need > self._context:
            raise PromptTooLongError(
                f"{self._name}: request {rid}: a prompt of {length} tokens with "
                f"max_tokens={request.sampling.max_tokens} needs {need} positions; the "
                f"context length is {self._context}"
            )

    def abort(self, request_id: str) -> bool:
        """End request ``request_id`` at the next step boundary (its tokens so far are
        returned, ``finish_reason="abort"``); ``True`` if it was in flight."""
        with self._cond:
            flight = self._flights.get(request_id)
            if flight is None or flight.done.is_set():
                return False
            flight.aborted = True
            self._cond.notify_all()
            return True

    # --- the scheduler thread ---------------------------------------------------------------

    def _schedule(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._step(batch)
            except Exception as exc:  # the batch's callers get it; the engine goes on
                logger.exception("%s: a decoding step failed", self._name)
                with self._cond:
                    for flight in batch:
                        if not flight.done.is_set():
                            self._active.remove(flight)
                            flight.fail(exc)

    def _next_batch(self) -> list[Flight] | None:
        """Wait until requests may run (some active, not paused, the step delay over); the
        batch of the next step, or ``None`` once the engine is closed."""
        delay = self._config.step_delay_s
        deadline: float | None = None
        with self._cond:
            while True:
                self._end_aborted()
                if self._closed:
                    return None
                while self._waiting and len(self._active) < self._config.max_batch_size:
                    self._active.append(self._waiting.popleft())
                if not self._active or self._paused:
                    deadline = None
                    self._cond.wait()
                    continue
                if delay > 0:
                    now = time.monotonic()
                    deadline = now + delay if deadline is None else deadline
                    if deadline > now:
                        self._cond.wait(deadline - now)
                        continue
                return list(self._active)

    def _end_aborted(self) -> None:
        """End every aborted request (all of them once the engine is closed)."""
        closing = self._closed
        for flight in [*self._active, *self._waiting]:
            if flight.aborted or closing:
                self._end(flight, "abort")

    def _end(self, flight: Flight, reason: FinishReason) -> None:
        if flight in self._active:
            self._active.remove(flight)
        else:
            self._waiting.remove(flight)
        flight.finish(reason, self._version)

    def _step(self, batch: list[Flight]) -> None:
        with self._model_lock:
            version = self._version
            logits = next_logits(
                self._model, [f.sequence for f in batch], self._device, self._config.exact_window
            )
        picks = [pick(logits[i], f.request.sampling, f.generator) for i, f in enumerate(batch)]
        with self._cond:
            for flight, (token, logprob) in zip(batch, picks, strict=True):
                reason = flight.record(token, logprob, version)
                if reason is not None:
                    self._end(flight, reason)

    # --- weights ----------------------------------------------------------------------------

    def load_weights(self, update: WeightUpdate) -> int:
        """Take the weights at ``update.path`` (a safetensors file, or a Hugging Face
        directory of ``*.safetensors``) as ``update.version``; requests in flight continue on
        them from their next token. Every name and shape is checked first: what does not fit
        is a :class:`sc_rollout.errors.WeightMismatchError` and the engine keeps its weights.
        Returns the version now held."""
        if not isinstance(update, WeightUpdate):
            raise RolloutTypeError(
                f"{self._name}: load_weights() takes a WeightUpdate, got {type(update).__name__}"
            )
        where = f"{self._name}: load_weights(version={update.version})"
        with self._cond:
            self._check_version(update.version, where)
        if update.path is None:
            raise WeightLoadError(
                f"{where}: the update names no path; the torch engine reads its weights from "
                "a safetensors file or a model directory"
            )
        tensors = read_weights(update.path, where)
        self._spec.check(tensors, f"{where} from {update.path!r}")
        with self._model_lock:
            with self._cond:
                self._check_version(update.version, where)
                level = self._sleep_level
            if level == 0:
                copy_into(self._model.model, self._spec, tensors)
            elif level == 1 and self._snapshot is not None:
                with torch.no_grad():
                    for name, value in self._spec.canonical(tensors).items():
                        self._snapshot[name].copy_(value)
            # asleep at level 2: wake_up reads the new path
            with self._cond:
                self._version = update.version
                self._weights_path = update.path
                self._cond.notify_all()
        logger.info("%s: weights at version %d from %s", self._name, update.version, update.path)
        return update.version

    def _check_version(self, version: int, where: str) -> None:
        if version < self._version:
            raise WeightVersionError(
                f"{where} is below the version it holds, {self._version}; the engine keeps "
                "its weights"
            )

    def weight_version(self) -> int:
        """The version of the weights the engine holds."""
        with self._cond:
            return self._version

    # --- state ------------------------------------------------------------------------------

    def pause(self) -> None:
        """Hold every request before its next token until :meth:`resume` (a step already
        running finishes)."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        """Let paused requests continue."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def health(self) -> EngineHealth:
        """The engine's state now."""
        with self._cond:
            return EngineHealth(
                model=self._name,
                context_length=self._context,
                weight_version=self._version,
                paused=self._paused,
                sleeping=self._sleep_level > 0,
                in_flight=len(self._flights),
            )

    def sleep(self, level: int = 1) -> None:
        """Free the model's memory: level 1 keeps a CPU copy of the weights, level 2 drops
        them (:meth:`wake_up` reads them again from the current version's path). Refused
        while requests are in flight."""
        if isinstance(level, bool) or not isinstance(level, int):
            raise RolloutTypeError(f"{self._name}: sleep(level) takes an int, got {level!r}")
        if level not in (1, 2):
            raise RolloutRequestError(f"{self._name}: sleep(level) takes 1 or 2, got {level}")
        with self._model_lock:
            with self._cond:
                if self._closed:
                    raise EngineStateError(f"{self._name}: sleep(level={level}) after close()")
                if self._flights:
                    raise EngineStateError(
                        f"{self._name}: sleep(level={level}) while {len(self._flights)} "
                        "request(s) are in flight; abort them or wait"
                    )
                before = self._sleep_level
                self._sleep_level = max(before, level)
            if before == 0 and level == 1:
                self._snapshot = snapshot(self._model.model, self._spec)
            if level == 2:
                self._snapshot = None
            if before == 0:
                free(self._model.model, self._spec)
        logger.info("%s: asleep (level %d)", self._name, max(before, level))

    def wake_up(self) -> None:
        """Leave sleep with the current version's weights (from the CPU copy, or read again
        from their path). A path that cannot be read any more is a
        :class:`sc_rollout.errors.WeightLoadError`, and the engine stays asleep."""
        with self._model_lock:
            with self._cond:
                level, path, version = self._sleep_level, self._weights_path, self._version
            if level == 0:
                return
            if self._snapshot is not None:
                tensors = self._snapshot
            else:
                tensors = self._read_again(path, version)
            restore(self._model.model, self._spec, tensors)
            self._snapshot = None
            with self._cond:
                self._sleep_level = 0
                self._cond.notify_all()
        logger.info("%s: awake at version %d", self._name, version)

    def _read_again(self, path: str, version: int) -> dict[str, Tensor]:
        where = f"{self._name}: wake_up() at version {version}"
        folder = Path(path)
        if folder.is_dir() and not any(folder.glob("*.safetensors")):
            # a model directory with other weight files (.bin): transformers reads them
            tensors: dict[str, Tensor] = self._load(path).model.state_dict()
        else:
            tensors = read_weights(path, where)
        self._spec.check(tensors, f"{where} from {path!r}")
        return tensors

    def close(self) -> None:
        """Stop the scheduler thread; requests still in flight end as aborted (their tokens
        so far), later calls of :meth:`generate` are an :class:`sc_rollout.errors.EngineStateError`.
        Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        logger.info("%s: closed", self._name)
