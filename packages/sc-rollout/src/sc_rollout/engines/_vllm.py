"""``VLLMEngine``: vLLM behind the rollout-engine contract. Runs in the vLLM environment
(see ``_vllm_env``), inside the server process ``python -m sc_rollout vllm``.

vLLM's asynchronous engine (``AsyncLLM``) runs on an asyncio loop in a thread of its own;
each contract call from a server thread is one coroutine on that loop. Token in, token
out: vLLM is started without its tokenizer, stop tokens come from the request only (the
model's eos is ignored, as the built-in sampler does), and each token's log-probability is
vLLM's processed one (after temperature, ``logprobs_mode="processed_logprobs"``), what a
trainer recomputes; with top-p below 1 vLLM's is over the nucleus, the trainer's is not.

A weight update pauses the scheduler with requests kept in place, reloads the weights in the
workers from the pushed safetensors (vLLM's ``reload_weights``, which repacks them for its
kernels; ``_vllm_worker`` handles the layers with tied weights), and resumes: requests in
flight go on under the new weights from their next token (their key/value cache so far was
computed under the old ones, as in every engine that keeps requests across an update).
Prefix caching is off, so no new request reuses a cache computed under old weights. Each
token is stamped with the version the engine held when it arrived; the version moves only
after the scheduler resumed, so a stamp is never newer than the weights that produced the
token."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import tempfile
import threading
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from .._errors import (
    EngineNotInstalledError,
    EngineStateError,
    PromptTooLongError,
    RolloutRequestError,
    RolloutServerError,
    UnservableModelError,
    WeightLoadError,
    WeightVersionError,
)
from ._safetensors import check_same_tensors, read_shapes
from ._types import (
    EngineHealth,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightUpdate,
)
from ._vllm_config import VLLMEngineConfig, model_facts
from ._vllm_env import CREATE_COMMAND

__all__ = ["VLLMEngine"]

_log = logging.getLogger("sc_rollout.vllm")

T = TypeVar("T")

#: the smallest attention head vLLM's CPU attention kernels take
_CPU_MIN_HEAD_SIZE = 32


def _import_vllm() -> dict[str, Any]:
    try:
        return {
            "AsyncEngineArgs": importlib.import_module("vllm.engine.arg_utils").AsyncEngineArgs,
            "AsyncLLM": importlib.import_module("vllm.v1.engine.async_llm").AsyncLLM,
            "SamplingParams": importlib.import_module("vllm").SamplingParams,
            "RequestOutputKind": importlib.import_module("vllm.sampling_params").RequestOutputKind,
            "TokensPrompt": importlib.import_module("vllm.inputs").TokensPrompt,
            "platform": importlib.import_module("vllm.platforms").current_platform,
            "registry": importlib.import_module("vllm.model_executor.models").ModelRegistry,
        }
    except ImportError as exc:
        raise EngineNotInstalledError(
            f"vLLM cannot be imported in this environment ({exc}): the vLLM engine runs in "
            f"its own environment, made by `{CREATE_COMMAND}`"
        ) from None


def _head_size(facts: dict[str, Any]) -> int | None:
    if isinstance(facts.get("head_dim"), int):
        return int(facts["head_dim"])
    hidden = facts.get("hidden_size", facts.get("n_embd"))
    heads = facts.get("num_attention_heads", facts.get("n_head"))
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def _context_length(facts: dict[str, Any]) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        if isinstance(facts.get(key), int):
            return int(facts[key])
    return None


class VLLMEngine:
    """vLLM serving one local model, as a :class:`~sc_rollout.RolloutEngine`.

    Construction starts vLLM and runs one token of warm-up, so a model vLLM cannot serve
    fails here, as an :class:`UnservableModelError` with vLLM's reason. Sleep needs vLLM's
    sleep mode, which its CPU build does not have: there, :meth:`sleep` is an
    :class:`EngineStateError` and nothing changes.
    """

    def __init__(self, config: VLLMEngineConfig) -> None:
        self._config = config
        self._vllm = _import_vllm()
        facts = model_facts(config.model)
        self._check_servable(facts)
        limit = config.max_model_len or _context_length(facts)
        if limit is None:
            raise UnservableModelError(
                f"VLLMEngine: {config.model}: config.json gives no context length; pass "
                "max_model_len"
            )
        self._max_len = limit
        vocab = facts.get("vocab_size")
        self._vocab = int(vocab) if isinstance(vocab, int) else None
        self._shapes = read_shapes(config.model, f"VLLMEngine({config.served_name})")
        self._weights_path = config.model
        self._version = 0
        self._paused = False
        self._sleeping = False
        self._lock = threading.Lock()
        self._update_lock = threading.Lock()
        self._in_flight: dict[str, str] = {}  # request id -> vLLM's id
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sc-vllm-loop", daemon=True
        )
        self._thread.start()
        self._sleep_mode = bool(self._vllm["platform"].is_sleep_mode_available())
        try:
            self._llm: Any = self._run(self._start())
            self._warm_up()
        except Exception as exc:
            self.close()
            if isinstance(exc, (UnservableModelError, EngineNotInstalledError)):
                raise
            raise UnservableModelError(
                f"VLLMEngine: vLLM could not serve {config.model} "
                f"({type(exc).__name__}: {exc}); the server's stderr has vLLM's log"
            ) from exc

    def _check_servable(self, facts: dict[str, Any]) -> None:
        where = f"VLLMEngine: {self._config.model}"
        archs = facts.get("architectures")
        if not isinstance(archs, list) or not archs:
            raise UnservableModelError(f"{where}: config.json names no architecture")
        supported = set(self._vllm["registry"].get_supported_archs())
        if not any(arch in supported for arch in archs):
            raise UnservableModelError(
                f"{where}: vLLM supports none of its architectures {archs} "
                f"({len(supported)} are supported)"
            )
        head = _head_size(facts)
        if self._vllm["platform"].is_cpu() and head is not None and head < _CPU_MIN_HEAD_SIZE:
            raise UnservableModelError(
                f"{where}: attention heads of size {head}; vLLM's CPU attention needs at "
                f"least {_CPU_MIN_HEAD_SIZE} (use fewer, wider heads)"
            )
        if self._vllm["platform"].is_cpu() and self._config.dtype == "float16":
            raise UnservableModelError(f"{where}: vLLM's CPU build does not run float16")

    async def _start(self) -> Any:
        cfg = self._config
        args = self._vllm["AsyncEngineArgs"](
            model=cfg.model,
            served_model_name=cfg.served_name,
            dtype=cfg.dtype,
            seed=cfg.seed,
            max_model_len=self._max_len,
            max_num_seqs=cfg.max_num_seqs,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enforce_eager=True,
            enable_prefix_caching=False,
            skip_tokenizer_init=True,
            generation_config="vllm",
            enable_sleep_mode=self._sleep_mode,
            disable_log_stats=True,
            # log-probs after temperature (and the ban's bias), as the trainer recomputes them
            logprobs_mode="processed_logprobs",
            worker_extension_cls="sc_rollout.engines._vllm_worker.ScWorkerExtension",
        )
        return self._vllm["AsyncLLM"].from_engine_args(args)

    def _warm_up(self) -> None:
        request = GenerateRequest(
            prompt_ids=(0,),
            sampling=SamplingParams(max_tokens=1, temperature=0.0),
            request_id=f"sc-warm-up-{uuid.uuid4().hex}",
        )
        self._run(self._generate(request, "sc-warm-up"))

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    # -- generation ---------------------------------------------------------------------

    def generate(self, request: GenerateRequest) -> GenerateResult:
        where = f"VLLMEngine({self._config.served_name}).generate({request.request_id})"
        prompt, sampling = request.prompt_ids, request.sampling
        if len(prompt) + sampling.max_tokens > self._max_len:
            raise PromptTooLongError(
                f"{where}: {len(prompt)} prompt tokens and max_tokens {sampling.max_tokens} "
                f"exceed the context of {self._max_len}"
            )
        if self._vocab is not None:
            for token in prompt:
                if token >= self._vocab:
                    raise RolloutRequestError(
                        f"{where}: token id {token} is outside the vocabulary of {self._vocab}"
                    )
        internal = f"{request.request_id}-{uuid.uuid4().hex[:8]}"
        with self._lock:
            if self._sleeping:
                raise EngineStateError(f"{where}: the engine is asleep; wake_up() first")
            if request.request_id in self._in_flight:
                raise RolloutRequestError(f"{where}: this request id is already in flight")
            self._in_flight[request.request_id] = internal
        try:
            return self._run(self._generate(request, internal))
        finally:
            with self._lock:
                self._in_flight.pop(request.request_id, None)

    async def _generate(self, request: GenerateRequest, internal: str) -> GenerateResult:
        sampling = request.sampling
        params = self._vllm["SamplingParams"](
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            stop_token_ids=list(sampling.stop_token_ids),
            # a bias of -100 (the OpenAI bound vLLM keeps) is a ban; the processed log-probs
            # include it, so they are about those renormalised over the allowed tokens
            logit_bias={t: -100.0 for t in sampling.banned_token_ids} or None,
            ignore_eos=True,
            logprobs=0,
            detokenize=False,
            output_kind=self._vllm["RequestOutputKind"].DELTA,
        )
        prompt = self._vllm["TokensPrompt"](prompt_token_ids=list(request.prompt_ids))
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        reason: str | None = None
        async for output in self._llm.generate(prompt, params, internal):
            done = output.outputs[0]
            version = self._version
            for i, token in enumerate(done.token_ids):
                tokens.append(int(token))
                logprobs.append(float(done.logprobs[i][token].logprob))
                versions.append(version)
            if done.finish_reason is not None:
                reason = str(done.finish_reason)
        finish: FinishReason
        if reason in ("stop", "length"):
            finish = "stop" if reason == "stop" else "length"
        elif reason in (None, "abort"):
            finish = "abort"
        else:
            raise RolloutServerError(
                f"VLLMEngine.generate({request.request_id}): vLLM ended the request with {reason!r}"
            )
        return GenerateResult(
            request_id=request.request_id,
            token_ids=tuple(tokens),
            logprobs=tuple(logprobs),
            finish_reason=finish,
            weight_version=versions[-1] if versions else self._version,
            min_weight_version=versions[0] if versions else None,
        )

    def abort(self, request_id: str) -> bool:
        with self._lock:
            internal = self._in_flight.get(request_id)
        if internal is None:
            return False
        self._run(self._llm.abort(internal))
        return True

    # -- control --------------------------------------------------------------------------

    def pause(self) -> None:
        with self._update_lock:
            if not self._paused:
                self._run(self._llm.pause_generation(mode="keep", clear_cache=False))
                self._paused = True

    def resume(self) -> None:
        with self._update_lock:
            if self._paused:
                self._run(self._llm.resume_generation())
                self._paused = False

    def load_weights(self, update: WeightUpdate) -> int:
        where = f"VLLMEngine({self._config.served_name}).load_weights(version {update.version})"
        if update.path is None:
            raise WeightLoadError(f"{where}: vLLM loads weights from a path; the update has none")
        with self._update_lock:
            if update.version < self._version:
                raise WeightVersionError(
                    f"{where}: the engine already holds version {self._version}"
                )
            check_same_tensors(self._shapes, read_shapes(update.path, where), where)
            folder, scratch = self._weights_folder(update.path)
            try:
                self._run(self._reload(folder, keep_paused=self._paused))
            except Exception as exc:
                raise WeightLoadError(
                    f"{where}: vLLM failed to reload {update.path!r}: {type(exc).__name__}: {exc}"
                ) from exc
            finally:
                if scratch is not None:
                    scratch.cleanup()
            self._weights_path = update.path
            self._version = update.version
            _log.info("%s: loaded %s", where, update.path)
            return self._version

    @staticmethod
    def _weights_folder(path: str) -> tuple[str, tempfile.TemporaryDirectory[str] | None]:
        """vLLM reloads from a folder of safetensors files: a single file is linked into a
        scratch folder of its own."""
        if Path(path).is_dir():
            return path, None
        scratch = tempfile.TemporaryDirectory(prefix="sc-vllm-weights-")
        (Path(scratch.name) / "model.safetensors").symlink_to(Path(path).resolve())
        return scratch.name, scratch

    async def _reload(self, folder: str, keep_paused: bool) -> None:
        if not keep_paused:
            await self._llm.pause_generation(mode="keep", clear_cache=False)
        try:
            await self._llm.collective_rpc("sc_reload_weights", args=(folder,))
        finally:
            if not keep_paused:
                await self._llm.resume_generation()

    def weight_version(self) -> int:
        return self._version

    def health(self) -> EngineHealth:
        if self._llm.errored:
            raise RolloutServerError(
                f"VLLMEngine({self._config.served_name}): vLLM's engine died: "
                f"{self._llm.dead_error}"
            )
        with self._lock:
            in_flight = len(self._in_flight)
        return EngineHealth(
            model=self._config.served_name,
            context_length=self._max_len,
            weight_version=self._version,
            paused=self._paused,
            sleeping=self._sleeping,
            in_flight=in_flight,
        )

    def sleep(self, level: int = 1) -> None:
        where = f"VLLMEngine({self._config.served_name}).sleep({level})"
        if level not in (1, 2):
            raise RolloutRequestError(f"{where}: level must be 1 or 2")
        if not self._sleep_mode:
            raise EngineStateError(
                f"{where}: vLLM has no sleep mode on this platform (its CPU build); the "
                "engine keeps its memory"
            )
        with self._lock:
            if self._in_flight:
                raise EngineStateError(f"{where}: {len(self._in_flight)} requests in flight")
            self._sleeping = True
        self._run(self._llm.sleep(level))
        self._slept_level = level

    def wake_up(self) -> None:
        if not self._sleeping:
            return
        self._run(self._llm.wake_up())
        if getattr(self, "_slept_level", 1) == 2:
            folder, scratch = self._weights_folder(self._weights_path)
            try:
                self._run(self._reload(folder, keep_paused=True))
            finally:
                if scratch is not None:
                    scratch.cleanup()
        with self._lock:
            self._sleeping = False

    def close(self) -> None:
        """Stop vLLM (its engine-core processes) and the loop thread."""
        llm = getattr(self, "_llm", None)
        if llm is not None:
            try:
                llm.shutdown()
            except Exception:  # shutting down: the process ends next
                _log.exception("VLLMEngine: vLLM's shutdown failed")
            self._llm = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
