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
from ..engine import PipelineEngine
from ._ppo import BANNED, policy_role, response_head, value_head, value_role
from ._ppo_loop import Accumulate, Meter, MiniBatch, Role, micro_slices, response_mask_of, run_ppo

__all__ = [
    "pipelined_log_prob",
    "pipelined_update_critic",
    "pipelined_update_policy",
    "pipelined_values",
]

_Inputs = tuple[Tensor, Tensor, Tensor]


def _inputs(micro: dict[str, Tensor]) -> _Inputs:
    return micro["input_ids"], micro["attention_mask"], micro["position_ids"]


def _schedule_args(
    engine: PipelineEngine,
    micros: list[dict[str, Tensor]],
    head: Callable[[dict[str, Tensor]], Any],
) -> tuple[list[_Inputs], list[Any]]:
    """What a schedule takes for ``micros``: the model inputs (on the first stage) and each
    micro-batch's ``head(micro)`` (on the last stage; ``None`` elsewhere)."""
    last = engine.is_last_stage
    heads = [head(m) if last else None for m in micros]
    inputs = [_inputs(m) for m in micros] if engine.is_first_stage else []
    return inputs, heads


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
    return [{k: v[sl] for k, v in tensors.items()} for sl in micro_slices(padded, size)]


def pipelined_log_prob(
    engine: PipelineEngine,
    tensors: dict[str, Tensor],
    total: int,
    response_length: int,
    temperature: float,
    micro_batch_size: int,
) -> tuple[Tensor, Tensor]:
    """Log-probabilities and entropies ``[total, response_length]`` (zeros off the last
    stage); under a ``banned_token_ids`` column's renormalisation as in
    :func:`._ppo.compute_log_prob`."""
    engine.eval_mode()
    micros = _padded_micro_batches(engine, tensors, total, micro_batch_size)
    out = engine.forward_only(
        *_schedule_args(
            engine, micros, lambda m: response_head(m["responses"], temperature, m.get(BANNED))
        )
    )
    if not engine.is_last_stage:
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
    out = engine.forward_only(
        *_schedule_args(engine, micros, lambda _: value_head(response_length))
    )
    if not engine.is_last_stage:
        return torch.zeros(total, response_length)
    values: Tensor = out[:total].cpu()
    return values * response_mask_of(tensors).to(values.dtype)


class _MicroMeters:
    """One meter per micro-batch, merged into the step's meter after the schedule: the
    schedule may evaluate a micro-batch's loss more than once (torch's pipelining infers
    the first micro-batch's shapes with an extra call), and the last call counts."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.micros: dict[int, Meter] = {}

    def for_micro(self, index: Tensor) -> Meter:
        fresh = Meter(self.meter.group)
        self.micros[int(index)] = fresh
        return fresh

    def merge(self) -> None:
        for index in sorted(self.micros):
            self.meter.merge(self.micros[index])
        self.micros = {}


def _scheduled_loss(
    output: Any,
    index: Tensor,
    micros: list[dict[str, Tensor]],
    role: Role,
    denominator: float,
    meters: _MicroMeters,
    scale: float,
) -> Tensor:
    micro, meter = micros[int(index)], meters.for_micro(index)
    return role.loss(output, micro, denominator, meter) * scale


def scheduled_steps(engine: PipelineEngine) -> Accumulate:
    """A mini-batch's micro-batches through one pipeline schedule: the first stage feeds
    the inputs, the last stage applies the role's head and loss."""

    def accumulate(mb: MiniBatch, role: Role, meter: Meter, grad_scale: float) -> None:
        meters = _MicroMeters(meter)
        loss_fn = functools.partial(
            _scheduled_loss,
            micros=mb.micro_batches,
            role=role,
            denominator=mb.denominator,
            meters=meters,
            scale=grad_scale,
        )
        engine.train_step(*_schedule_args(engine, mb.micro_batches, role.head), loss_fn)
        meters.merge()

    return accumulate


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
    role = policy_role(config, temperature)
    steps = scheduled_steps(engine)
    last = engine.is_last_stage
    return run_ppo(engine, tensors, total, config, sizes, seed, where, role, steps, last)


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
    role = value_role(config)
    steps = scheduled_steps(engine)
    last = engine.is_last_stage
    return run_ppo(engine, tensors, total, config, sizes, seed, where, role, steps, last)
