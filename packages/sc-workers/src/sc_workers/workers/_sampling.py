"""Autoregressive sampling with the engine's model (temperature, top-k, top-p, eos)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from ..engine import Engine
from ..models import rows_forward

__all__ = ["BatchSampling", "filter_logits", "generate"]


@dataclass(frozen=True)
class BatchSampling:
    """How one ``generate_sequences`` call samples its batch in the training engine: the
    rollout config, overridden by the batch's ``meta_info``. (A rollout engine's request
    samples with :class:`sc_rollout.SamplingParams` instead.)"""

    response_length: int
    temperature: float
    top_k: int
    top_p: float
    do_sample: bool
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    #: the exact mode's window (``RolloutConfig.exact_window``); 0: off
    exact_window: int = 0


def filter_logits(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf; keeps at least one token."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = F.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass strictly before each token
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _next_token(logits: Tensor, params: BatchSampling, generator: torch.Generator) -> Tensor:
    logits = logits.float()
    if not params.do_sample:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits / params.temperature, params.top_k, params.top_p)
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _all_finished(finished: Tensor, device: torch.device, group: dist.ProcessGroup | None) -> bool:
    """True when every sequence on every rank of ``group`` (``None``: all ranks) is done:
    the ranks that run each forward together take the same number of steps."""
    flag = torch.tensor([0 if bool(finished.all()) else 1], dtype=torch.int64, device=device)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return int(flag.item()) == 0


@torch.no_grad()
def generate(
    engine: Engine,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    params: BatchSampling,
    generator: torch.Generator,
    use_cache: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """Sample up to ``response_length`` tokens after left-padded prompts.

    Returns ``(responses, response_mask, log_probs)``, all ``[batch, response_length]``:
    tokens after a sequence's eos are ``pad_token_id`` with mask 0; the eos itself has mask 1.
    ``log_probs`` is each sampled token's log-probability under the sampling model with the
    logits divided by the temperature (top-k / top-p filtering not applied: the definition of
    the actor's ``compute_log_prob``), 0 where the mask is 0. It is computed from the logits
    the sampler already has, and draws nothing from ``generator``. The ranks of
    ``engine.step_group`` run the same number of decoding steps (a sharded model needs every
    one of them in each forward; replicas of a rollout step independently).
    With ``use_cache`` and a model that has one (the built-in model, a Hugging Face causal
    LM), each step feeds only the new token through the key/value cache; otherwise each
    step recomputes the whole sequence. In the exact mode (``params.exact_window``) each step
    recomputes each sequence alone in its window (:func:`~sc_workers.models.window_forward`),
    as the actor's ``compute_log_prob`` and ``update_actor`` do then, so the log-probs are
    theirs bit for bit.
    """
    device = engine.device
    ids = input_ids.to(device)
    mask = attention_mask.to(device)
    pos = position_ids.to(device)
    batch = ids.shape[0]
    length = params.response_length
    responses = torch.full((batch, length), params.pad_token_id, dtype=ids.dtype, device=device)
    response_mask = torch.zeros((batch, length), dtype=mask.dtype, device=device)
    log_probs = torch.zeros((batch, length), dtype=torch.float32, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    eos = torch.tensor(list(params.eos_token_ids), dtype=ids.dtype, device=device)
    window = params.exact_window
    cache = engine.new_cache() if use_cache and not window else None

    def last_logits(ids: Tensor, mask: Tensor, pos: Tensor) -> Tensor:
        return rows_forward(engine.forward, ids, mask, pos, window, "generate")[:, -1, :]

    logits = (
        last_logits(ids, mask, pos)
        if cache is None
        else engine.forward(ids, mask, pos, cache)[:, -1, :]
    )
    all_ids, all_mask, all_pos = ids, mask, pos
    last_pos = pos[:, -1]
    for t in range(length):
        token = _next_token(logits, params, generator)
        alive = ~finished
        token = torch.where(alive, token, torch.full_like(token, params.pad_token_id))
        responses[:, t] = token
        response_mask[:, t] = alive.to(mask.dtype)
        token_log_prob = _token_log_prob(logits, token, params.temperature)
        log_probs[:, t] = torch.where(alive, token_log_prob, torch.zeros_like(token_log_prob))
        finished = finished | torch.isin(token, eos)
        if t == length - 1 or _all_finished(finished, device, engine.step_group):
            break
        last_pos = last_pos + 1
        new_mask = alive.to(mask.dtype)[:, None]
        all_ids = torch.cat([all_ids, token[:, None]], dim=1)
        all_mask = torch.cat([all_mask, new_mask], dim=1)
        all_pos = torch.cat([all_pos, last_pos[:, None]], dim=1)
        if cache is not None:
            logits = engine.forward(token[:, None], all_mask, last_pos[:, None], cache)[:, -1, :]
        else:
            logits = last_logits(all_ids, all_mask, all_pos)
    return responses, response_mask, log_probs


def _token_log_prob(logits: Tensor, token: Tensor, temperature: float) -> Tensor:
    """``log_softmax(logits / temperature)`` at ``token`` (float32), row by row."""
    log_softmax = F.log_softmax(logits.float() / temperature, dim=-1)
    return log_softmax.gather(-1, token[:, None]).squeeze(-1)


def eos_tuple(value: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
