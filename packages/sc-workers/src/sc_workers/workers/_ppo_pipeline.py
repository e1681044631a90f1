"""The per-rank PPO computations on a pipelined engine (:class:`~sc_workers.engine.PipelineEngine`).

The same losses as :mod:`._ppo`, computed on the last stage inside the schedule: the last
stage turns its logits into the response tokens' log-probabilities and entropies (or the
critic's values) through a *head*, and the schedule's loss function applies the PPO (value)
loss to each micro-batch. The first stage reads the model inputs; a middle stage reads
nothing but the number of rows. Outputs exist on the last stage only; the other stages
return zeros of the same shape (their outputs are not collected).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._config import ActorConfig, BatchSizes, CriticConfig
from ..algos import entropy_from_logits, logprobs_from_logits
from ..engine import PipelineEngine
from ._ppo import (
    _Meter,
    _micro_slices,
    _mini_batches,
    close_policy_step,
    close_value_step,
    policy_loss,
    response_mask_of,
    value_loss,
)

__all__ = [
    "pipelined_log_prob",
    "pipelined_update_critic",
    "pipelined_update_policy",
    "pipelined_values",
]

_Inputs = tuple[Tensor, Tensor, Tensor]


def _response_head(responses: Tensor, temperature: float) -> Callable[[Tensor], Any]:
    """logits -> (log-probs, entropies) of the response tokens."""

    def head(logits: Tensor) -> tuple[Tensor, Tensor]:
        length = responses.shape[1]
        scaled = logits[:, -length - 1 : -1, :].float() / temperature
        log_prob = logprobs_from_logits(scaled, responses.to(scaled.device))
        # copies, not views of the stage's output (FSDP hooks a stage's outputs)
        return log_prob.clone(), entropy_from_logits(scaled).clone()

    return head


def _value_head(length: int) -> Callable[[Tensor], Tensor]:
    """values -> the values of the positions that predict the response tokens."""

    def head(values: Tensor) -> Tensor:
        return values[:, -length - 1 : -1].float().clone()

    return head


def _inputs(micro: dict[str, Tensor]) -> _Inputs:
    return micro["input_ids"], micro["attention_mask"], micro["position_ids"]


def _padded_micro_batches(
    engine: PipelineEngine, tensors: dict[str, Tensor], total: int, size: int
) -> list[dict[str, Tensor]]:
    """``tensors`` cut into micro-batches of ``size`` rows; a short last one is filled up
    with copies of row 0 (every micro-batch of a schedule has one shape), and the number
    of micro-batches is a multiple of pp for the interleaved schedule."""
    size = min(size, max(total, 1))
    count = -(-total // size)
    if engine.megatron.schedule == "Interleaved1F1B":
        pp = engine.layout.pp_size
        count = -(-count // pp) * pp
    padded = count * size
    if padded > total and tensors:
        fill = torch.zeros(padded - total, dtype=torch.long)
        index = torch.cat([torch.arange(total), fill])
        tensors = {k: v[index] for k, v in tensors.items()}
    return [{k: v[sl] for k, v in tensors.items()} for sl in _micro_slices(padded, size)]


def pipelined_log_prob(
    engine: PipelineEngine,
    tensors: dict[str, Tensor],
    total: int,
    response_length: int,
    temperature: float,
    micro_batch_size: int,
) -> tuple[Tensor, Tensor]:
    """Log-probabilities and entropies ``[total, response_length]`` (zeros off the last
    stage)."""
    engine.eval_mode()
    micros = _padded_micro_batches(engine, tensors, total, micro_batch_size)
    last = engine.is_last_stage
    heads = [_response_head(m["responses"], temperature) if last else None for m in micros]
    inputs = [_inputs(m) for m in micros] if engine.is_first_stage else []
    out = engine.forward_only(inputs, heads)
    if not last:
        zeros = torch.zeros(total, response_length)
        return zeros, zeros.clone()
    log_prob, entropy = out
    return log_prob[:total].cpu(), entropy[:total].cpu()


def pipelined_values(
    engine: PipelineEngine,
    tensors: dict[str, Tensor],
    total: int,
    response_length: int,
    micro_batch_size: int,
) -> Tensor:
    """Values of the response tokens, zero outside ``response_mask`` (zeros off the last
    stage)."""
    engine.eval_mode()
    micros = _padded_micro_batches(engine, tensors, total, micro_batch_size)
    last = engine.is_last_stage
    heads = [_value_head(response_length) if last else None for _ in micros]
    inputs = [_inputs(m) for m in micros] if engine.is_first_stage else []
    out = engine.forward_only(inputs, heads)
    if not last:
        return torch.zeros(total, response_length)
    values: Tensor = out[:total].cpu()
    return values * response_mask_of(tensors).to(values.dtype)


class _MicroMeters:
    """One meter per micro-batch, merged into the step's meter after the schedule: the
    schedule may evaluate a micro-batch's loss more than once (torch's pipelining infers
    the first micro-batch's shapes with an extra call), and the last call counts."""

    def __init__(self, meter: _Meter) -> None:
        self.meter = meter
        self.micros: dict[int, _Meter] = {}

    def for_micro(self, index: Tensor) -> _Meter:
        fresh = _Meter(self.meter.group)
        self.micros[int(index)] = fresh
        return fresh

    def merge(self) -> None:
        for index in sorted(self.micros):
            self.meter.merge(self.micros[index])
        self.micros = {}


def _policy_loss(
    output: tuple[Tensor, Tensor],
    index: Tensor,
    micros: list[dict[str, Tensor]],
    config: ActorConfig,
    denominator: float,
    meters: _MicroMeters,
    scale: float,
) -> Tensor:
    log_prob, entropy = output
    micro, meter = micros[int(index)], meters.for_micro(index)
    return policy_loss(log_prob, entropy, micro, config, denominator, meter) * scale


def _value_loss(
    vpreds: Tensor,
    index: Tensor,
    micros: list[dict[str, Tensor]],
    config: CriticConfig,
    denominator: float,
    meters: _MicroMeters,
    scale: float,
) -> Tensor:
    micro, meter = micros[int(index)], meters.for_micro(index)
    return value_loss(vpreds, micro, config, denominator, meter) * scale


def pipelined_update_policy(
    engine: PipelineEngine,
    tensors: dict[str, Tensor],
    total: int,
    config: ActorConfig,
    sizes: BatchSizes,
    temperature: float,
    seed: int,
    where: str,
) -> dict[str, float]:
    """:func:`._ppo.update_policy` through the pipeline schedule.

    The mini-batch order is the same on every stage (the same seed and row count), so
    the first stage's inputs and the last stage's loss columns are the same rows. The
    last stage's metrics are dp-reduced; the gradient norm covers every stage.
    """
    last = engine.is_last_stage
    grad_scale = engine.grad_average_ranks
    meter = _Meter(engine.dp_group)
    meters = _MicroMeters(meter)
    batches = _mini_batches(engine, tensors, total, config, sizes, seed, where, count=last)
    for mb in batches:
        loss_fn = functools.partial(
            _policy_loss,
            micros=mb.micro_batches,
            config=config,
            denominator=mb.denominator,
            meters=meters,
            scale=grad_scale,
        )
        heads = [
            _response_head(m["responses"], temperature) if last else None for m in mb.micro_batches
        ]
        inputs = [_inputs(m) for m in mb.micro_batches] if engine.is_first_stage else []
        engine.train_step(inputs, heads, loss_fn)
        meters.merge()
        grad_norm = engine.optimizer_step(config.grad_clip)
        if last:
            close_policy_step(meter, mb.tokens, grad_norm)
    metrics = meter.result()
    if config.use_kl_loss and last:
        metrics["actor/kl_coef"] = config.kl_loss_coef
    return metrics


def pipelined_update_critic(
    engine: PipelineEngine,
    tensors: dict[str, Tensor],
    total: int,
    config: CriticConfig,
    sizes: BatchSizes,
    seed: int,
    where: str,
) -> dict[str, float]:
    """:func:`._ppo.update_critic` through the pipeline schedule."""
    last = engine.is_last_stage
    grad_scale = engine.grad_average_ranks
    meter = _Meter(engine.dp_group)
    meters = _MicroMeters(meter)
    length = int(tensors["responses"].shape[1]) if last else 0
    batches = _mini_batches(engine, tensors, total, config, sizes, seed, where, count=last)
    for mb in batches:
        loss_fn = functools.partial(
            _value_loss,
            micros=mb.micro_batches,
            config=config,
            denominator=mb.denominator,
            meters=meters,
            scale=grad_scale,
        )
        heads = [_value_head(length) if last else None for _ in mb.micro_batches]
        inputs = [_inputs(m) for m in mb.micro_batches] if engine.is_first_stage else []
        engine.train_step(inputs, heads, loss_fn)
        meters.merge()
        grad_norm = engine.optimizer_step(config.grad_clip)
        if last:
            close_value_step(meter, mb.tokens, grad_norm)
    return meter.result()
