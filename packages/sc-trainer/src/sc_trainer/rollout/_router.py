"""``RouterRollout``: ``generate_sequences`` on the driver, over a router of rollout servers.

Each row of a prompt batch (left-padded ``input_ids`` with their ``attention_mask`` and
``position_ids``) becomes one :class:`sc_rollout.GenerateRequest`: the row's tokens without
its padding, sent through the router from a thread pool, all rows at once. The output batch
has exactly the columns, dtypes and shapes of the rollout worker's (``generate_batch`` in
sc-workers): ``prompts``, ``responses`` (right-padded to the response length with the pad
id), ``input_ids``, ``attention_mask`` and ``position_ids`` (prompt and response together),
``response_mask`` (1 up to and including an eos) and ``rollout_log_probs`` (float32, 0 on
padding), rows in input order; plus the non-tensor columns ``weight_version_min`` and
``weight_version_max`` (the weight versions of each row's first and last token) and
``meta_info["weight_version"]``, the oldest version of any row.

``rollout_log_probs`` are what the engine reports; the rollout-engine contract makes them
the model's log-probabilities after temperature, as the worker's sampler and the actor's
``compute_log_prob`` compute them.

Each request's id is ``<batch id>-<row>`` (``-r<k>`` added when a row is generated again), so
a request the router sends again to another server, after the first one died, is still one
request, answered once.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from sc_protocol import DataProto
from sc_rollout import GenerateRequest, GenerateResult, Router, SamplingParams
from sc_workers import ModelConfig, RolloutConfig
from sc_workers.workers import rollout_tensors

from .._errors import RolloutInputError, WorkerOutputError

__all__ = ["PendingBatch", "RouterRollout", "RouterSampling"]

logger = logging.getLogger(__name__)

_PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise RolloutInputError(f"{where} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise RolloutInputError(f"{where} must be finite, got {value!r}")
    return number


def _integer(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise RolloutInputError(f"{where} must be an int, got {value!r}")
    return int(value)


def _eos(value: object, where: str) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),)
    if isinstance(value, (list, tuple)):
        return tuple(_integer(v, where) for v in value)
    raise RolloutInputError(f"{where} must be an int or a sequence of ints, got {value!r}")


@dataclass(frozen=True)
class RouterSampling:
    """The sampling of a router rollout: the worker's settings (the rollout and model
    configs, :meth:`from_configs`), overridden per batch by ``meta_info``
    (:meth:`with_meta`). ``do_sample=False`` samples greedily (temperature 0). ``seed``:
    each request's seed derives from it and the request id (``None``: random)."""

    response_length: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    do_sample: bool = True
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if _integer(self.response_length, "RouterSampling.response_length") < 1:
            raise RolloutInputError(
                f"RouterSampling.response_length must be >= 1, got {self.response_length}"
            )
        if _number(self.temperature, "RouterSampling.temperature") < 0:
            raise RolloutInputError(
                f"RouterSampling.temperature must be >= 0, got {self.temperature}"
            )
        if not 0 < _number(self.top_p, "RouterSampling.top_p") <= 1:
            raise RolloutInputError(f"RouterSampling.top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.do_sample, (bool, np.bool_)):
            raise RolloutInputError(
                f"RouterSampling.do_sample must be a bool, got {self.do_sample!r}"
            )
        eos = _eos(list(self.eos_token_ids), "RouterSampling.eos_token_ids")
        if _integer(self.pad_token_id, "RouterSampling.pad_token_id") < 0:
            raise RolloutInputError(
                f"RouterSampling.pad_token_id must be >= 0, got {self.pad_token_id}"
            )
        if self.seed is not None:
            _integer(self.seed, "RouterSampling.seed")
        object.__setattr__(self, "eos_token_ids", eos)
        object.__setattr__(self, "do_sample", bool(self.do_sample))

    @classmethod
    def from_configs(cls, rollout: RolloutConfig, model: ModelConfig) -> RouterSampling:
        """The sampling a :class:`~sc_workers.RolloutWorker` with these configs does."""
        if rollout.top_k > 0:
            raise RolloutInputError(
                f"RouterSampling: rollout.top_k={rollout.top_k}: rollout servers sample with "
                "temperature and top-p only; set top_k <= 0"
            )
        return cls(
            response_length=rollout.response_length,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            do_sample=rollout.do_sample,
            eos_token_ids=_eos(model.eos_token_id, "model.eos_token_id"),
            pad_token_id=model.pad_token_id,
            seed=rollout.seed,
        )

    def with_meta(self, meta: Mapping[str, Any]) -> RouterSampling:
        """These settings overridden by a batch's ``meta_info`` (the keys the worker reads:
        ``response_length`` or ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``,
        ``do_sample``, ``eos_token_id``, ``pad_token_id``)."""
        top_k = meta.get("top_k")
        if top_k is not None and _integer(top_k, "meta_info['top_k']") > 0:
            raise RolloutInputError(
                f"meta_info['top_k']={top_k}: rollout servers sample with temperature and "
                "top-p only"
            )
        changes: dict[str, Any] = {}
        length = meta.get("response_length", meta.get("max_new_tokens"))
        if length is not None:
            changes["response_length"] = _integer(length, "meta_info['response_length']")
        for key in ("temperature", "top_p"):
            if key in meta:
                changes[key] = _number(meta[key], f"meta_info[{key!r}]")
        if "do_sample" in meta:
            changes["do_sample"] = bool(meta["do_sample"])
        if "eos_token_id" in meta:
            changes["eos_token_ids"] = _eos(meta["eos_token_id"], "meta_info['eos_token_id']")
        if "pad_token_id" in meta:
            changes["pad_token_id"] = _integer(meta["pad_token_id"], "meta_info['pad_token_id']")
        return replace(self, **changes) if changes else self

    def params(self, request_id: str) -> SamplingParams:
        """The sampling parameters of request ``request_id``."""
        seed = None
        if self.seed is not None:
            seed = zlib.crc32(f"{self.seed}:{request_id}".encode()) & 0x7FFFFFFF
        return SamplingParams(
            max_tokens=self.response_length,
            temperature=self.temperature if self.do_sample else 0.0,
            top_p=self.top_p,
            seed=seed,
            stop_token_ids=self.eos_token_ids,
        )


def _prompt_tensors(prompts: DataProto, where: str) -> dict[str, torch.Tensor]:
    if not isinstance(prompts, DataProto):
        raise RolloutInputError(
            f"{where}: prompts must be a DataProto, got {type(prompts).__name__}"
        )
    batch: Any = prompts.batch
    found = {} if batch is None else {str(k): batch[k] for k in batch.keys()}  # noqa: SIM118
    missing = [k for k in _PROMPT_KEYS if not isinstance(found.get(k), torch.Tensor)]
    if missing:
        raise RolloutInputError(f"{where}: the prompt batch has no tensor {missing}")
    tensors = {k: found[k] for k in _PROMPT_KEYS}
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) != 1 or len(shapes["input_ids"]) != 2:
        raise RolloutInputError(f"{where}: the prompt columns must be [rows, length]: {shapes}")
    if shapes["input_ids"][0] == 0:
        raise RolloutInputError(f"{where}: the prompt batch has no rows")
    return tensors


class PendingBatch:
    """The requests of one prompt batch, in flight on a :class:`RouterRollout`'s pool.

    :meth:`results` waits for every row; :meth:`result` builds the output batch;
    :meth:`regenerate` sends rows again (a fresh request id each time); :meth:`abort` ends
    the requests in flight (their tokens so far are kept).
    """

    def __init__(
        self,
        rollout: RouterRollout,
        prompts: DataProto,
        tensors: dict[str, torch.Tensor],
        sampling: RouterSampling,
        batch_id: str,
        sessions: Sequence[str | None],
    ) -> None:
        self.batch_id = batch_id
        self.prompts = prompts
        self.sampling = sampling
        self._rollout = rollout
        self._tensors = tensors
        self._sessions = list(sessions)
        ids, mask = tensors["input_ids"], tensors["attention_mask"]
        self._rows: list[tuple[int, ...]] = []
        for row in range(ids.shape[0]):
            tokens = tuple(int(t) for t in ids[row][mask[row].bool()].tolist())
            if not tokens:
                raise RolloutInputError(
                    f"RouterRollout: batch {batch_id} row {row} has no prompt token "
                    "(its attention_mask is all 0)"
                )
            self._rows.append(tokens)
        self._attempts = [0] * len(self._rows)
        self._ids = [self._request_id(row) for row in range(len(self._rows))]
        self._futures = [self._send(row) for row in range(len(self._rows))]

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The prompt batch's ``input_ids``, ``attention_mask`` and ``position_ids``."""
        return dict(self._tensors)

    def _request_id(self, row: int) -> str:
        attempt = self._attempts[row]
        return f"{self.batch_id}-{row}" + (f"-r{attempt}" if attempt else "")

    def _send(self, row: int) -> concurrent.futures.Future[GenerateResult]:
        rid = self._ids[row]
        request = GenerateRequest(
            self._rows[row],
            self.sampling.params(rid),
            request_id=rid,
            session_id=self._sessions[row],
        )
        return self._rollout.pool.submit(self._rollout.router.generate, request)

    @property
    def request_ids(self) -> list[str]:
        """The id of each row's current request."""
        return list(self._ids)

    def done(self) -> bool:
        """Whether every row's request has ended."""
        return all(f.done() for f in self._futures)

    def results(self) -> list[GenerateResult]:
        """Every row's result, in row order, once all have ended. The first failure is
        raised after the other requests were aborted and waited for."""
        concurrent.futures.wait(self._futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        failed = [f for f in self._futures if f.done() and f.exception() is not None]
        if failed:
            self.abort()
            concurrent.futures.wait(self._futures)
            error = failed[0].exception()
            if error is not None:
                raise error
        return [f.result() for f in self._futures]

    def regenerate(self, rows: Sequence[int]) -> None:
        """Send ``rows`` again, each as a new request (their previous results, which must
        have ended, are replaced)."""
        for row in rows:
            if not self._futures[row].done():
                raise RolloutInputError(
                    f"PendingBatch {self.batch_id}: row {row} is still in flight; it cannot be "
                    "generated again"
                )
        for row in rows:
            self._attempts[row] += 1
            self._ids[row] = self._request_id(row)
            self._futures[row] = self._send(row)

    def abort(self) -> int:
        """Abort every request still in flight; how many were."""
        count = 0
        for rid, future in zip(self._ids, self._futures, strict=True):
            if not future.done() and self._rollout.router.abort(rid):
                count += 1
        return count

    def result(self) -> DataProto:
        """The output batch (see the module's documentation), once every row has ended."""
        return build_batch(self.prompts, self._tensors, self.results(), self.sampling)


def build_batch(
    prompts: DataProto,
    tensors: dict[str, torch.Tensor],
    results: Sequence[GenerateResult],
    sampling: RouterSampling,
) -> DataProto:
    """The rollout worker's output batch from one result per prompt row."""
    prompt_ids, mask, positions = (tensors[k] for k in _PROMPT_KEYS)
    rows, length = prompt_ids.shape[0], sampling.response_length
    if len(results) != rows:
        raise WorkerOutputError(f"router rollout: {len(results)} results for {rows} rows")
    responses = torch.full((rows, length), sampling.pad_token_id, dtype=prompt_ids.dtype)
    response_mask = torch.zeros((rows, length), dtype=mask.dtype)
    log_probs = torch.zeros((rows, length), dtype=torch.float32)
    low = np.zeros(rows, dtype=np.int64)
    high = np.zeros(rows, dtype=np.int64)
    for row, result in enumerate(results):
        count = len(result.token_ids)
        if count > length:
            raise WorkerOutputError(
                f"router rollout: request {result.request_id} (server {result.server}) "
                f"returned {count} tokens; the response length is {length}"
            )
        responses[row, :count] = torch.tensor(result.token_ids, dtype=prompt_ids.dtype)
        response_mask[row, :count] = 1
        log_probs[row, :count] = torch.tensor(result.logprobs, dtype=torch.float32)
        low[row] = (
            result.weight_version
            if result.min_weight_version is None
            else (result.min_weight_version)
        )
        high[row] = result.weight_version
    out = rollout_tensors(prompt_ids, mask, positions, responses, response_mask, log_probs)
    non_tensors = dict(prompts.non_tensor_batch)
    non_tensors["weight_version_min"] = low
    non_tensors["weight_version_max"] = high
    return DataProto.from_dict(
        tensors=out, non_tensors=non_tensors, meta_info={"weight_version": int(low.min())}
    )


class RouterRollout:
    """``generate_sequences`` over ``router`` (see the module's documentation), with the
    worker's ``sampling`` (overridden by each batch's ``meta_info``).

    ``max_concurrency``: requests in flight at once (the pool's threads; more rows wait).
    ``session_key``: a non-tensor column whose values are the requests' session ids (the
    prompt group ``uid`` of GRPO: a group's samples go to one server and share its prefix
    cache); ``None``: no sessions. Thread-safe; :meth:`close` (or ``with``) stops the pool.
    """

    def __init__(
        self,
        router: Router,
        sampling: RouterSampling | None = None,
        *,
        max_concurrency: int = 64,
        session_key: str | None = None,
    ) -> None:
        if not isinstance(router, Router):
            raise RolloutInputError(f"RouterRollout: router must be a Router, got {router!r}")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
            raise RolloutInputError(
                f"RouterRollout: max_concurrency must be an int, got {max_concurrency!r}"
            )
        if max_concurrency < 1:
            raise RolloutInputError(
                f"RouterRollout: max_concurrency must be >= 1, got {max_concurrency}"
            )
        self.router = router
        self.sampling = RouterSampling() if sampling is None else sampling
        self.session_key = session_key
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_concurrency, thread_name_prefix="sc-router-rollout"
        )

    def submit(self, prompts: DataProto, *, batch_id: str | None = None) -> PendingBatch:
        """Send every row of ``prompts`` now; returns at once. ``batch_id`` names the
        requests (default: a fresh one; it must not be in flight already)."""
        where = "RouterRollout.generate_sequences"
        tensors = _prompt_tensors(prompts, where)
        sampling = self.sampling.with_meta(prompts.meta_info)
        rows = tensors["input_ids"].shape[0]
        sessions: list[str | None] = [None] * rows
        if self.session_key is not None:
            column = prompts.non_tensor_batch.get(self.session_key)
            if column is None:
                raise RolloutInputError(
                    f"{where}: session_key {self.session_key!r} is not a non-tensor column "
                    f"of the batch ({sorted(prompts.non_tensor_batch)})"
                )
            sessions = [str(value) for value in column.tolist()]
        name = uuid.uuid4().hex[:12] if batch_id is None else batch_id
        if not isinstance(name, str) or not name:
            raise RolloutInputError(f"{where}: batch_id must be a non-empty str, got {name!r}")
        logger.debug("batch %s: %d rows sent", name, rows)
        return PendingBatch(self, prompts, tensors, sampling, name, sessions)

    def generate_sequences(self, prompts: DataProto, *, batch_id: str | None = None) -> DataProto:
        """Generate a response for every row of ``prompts`` and return the output batch."""
        return self.submit(prompts, batch_id=batch_id).result()

    def close(self) -> None:
        """Stop the pool once the requests in flight ended."""
        self.pool.shutdown(wait=True)

    def __enter__(self) -> RouterRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
