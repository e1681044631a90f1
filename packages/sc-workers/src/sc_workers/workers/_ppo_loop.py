"""The PPO loop that the actor and the critic share, on a plain or a pipelined engine:
epochs, the seeded shuffle, mini-batches cut into micro-batches, the dp-global loss
normalisers, gradient accumulation, the optimizer step and the step metrics. What differs
comes in as a :class:`Role` (the head and the loss of the policy or the critic) and an
:data:`Accumulate` (how an engine runs a mini-batch's micro-batches)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .._config import ActorConfig, BatchSizes, CriticConfig
from .._errors import BatchError
from ..algos import agg_loss_denominator
from ..engine import Engine

__all__ = [
    "Accumulate",
    "Meter",
    "MiniBatch",
    "Role",
    "micro_slices",
    "response_mask_of",
    "run_ppo",
]


def response_mask_of(tensors: dict[str, Tensor]) -> Tensor:
    """``response_mask`` if given, else the response part of ``attention_mask``."""
    if "response_mask" in tensors:
        return tensors["response_mask"]
    length = tensors["responses"].shape[1]
    return tensors["attention_mask"][:, -length:]


def micro_slices(total: int, size: int) -> Iterator[slice]:
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


def _check_batch(where: str, total: int, sizes: BatchSizes) -> None:
    if total % sizes.mini_batch_size:
        raise BatchError(
            f"{where}: this rank's batch of {total} sequences is not divisible by the per-rank "
            f"mini-batch size {sizes.mini_batch_size}"
        )


def _orders(total: int, epochs: int, shuffle: bool, seed: int) -> Iterator[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        yield torch.randperm(total, generator=gen) if shuffle else torch.arange(total)


class Meter:
    """Sums of metrics per mini-batch, reduced over the dp group, averaged over steps; and
    peaks (:meth:`peak`), reduced by their maximum, of which the first mini-batch's is kept."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.steps: dict[str, list[float]] = defaultdict(list)
        self.first_peaks: dict[str, float] = {}
        self._sums: dict[str, Tensor] = {}
        self._peaks: dict[str, Tensor] = {}

    def add(self, name: str, value: Tensor) -> None:
        v = value.detach().double().cpu()
        self._sums[name] = self._sums.get(name, torch.zeros((), dtype=torch.float64)) + v

    def peak(self, name: str, value: Tensor) -> None:
        """Keep the largest ``value`` of the current step under ``name``; the result reports
        the first step's (the first mini-batch's, taken before any optimizer step)."""
        v = value.detach().double().cpu()
        self._peaks[name] = torch.maximum(self._peaks[name], v) if name in self._peaks else v

    def merge(self, other: Meter) -> None:
        """Add ``other``'s sums (of the current step) to this meter's, and its peaks."""
        for name, value in other._sums.items():
            self.add(name, value)
        for name, value in other._peaks.items():
            self.peak(name, value)

    def close_step(self, weights: dict[str, float], extra: dict[str, float]) -> None:
        """All-reduce the sums over dp; each metric is divided by its weight."""
        names = sorted(self._sums)
        if names:
            packed = torch.stack([self._sums[n] for n in names])
            if dist.get_world_size(self.group) > 1:
                dist.all_reduce(packed, group=self.group)
            for n, v in zip(names, packed.tolist(), strict=True):
                self.steps[n].append(v / weights.get(n, 1.0))
        peaks = sorted(self._peaks)
        if peaks:
            packed = torch.stack([self._peaks[n] for n in peaks])
            if dist.get_world_size(self.group) > 1:
                dist.all_reduce(packed, op=dist.ReduceOp.MAX, group=self.group)
            for n, v in zip(peaks, packed.tolist(), strict=True):
                self.first_peaks.setdefault(n, v)
        for n, v in extra.items():
            self.steps[n].append(v)
        self._sums = {}
        self._peaks = {}

    def result(self) -> dict[str, float]:
        averaged = {k: sum(v) / len(v) for k, v in self.steps.items() if v}
        return {**averaged, **self.first_peaks}


def _global_count(count: Tensor, group: dist.ProcessGroup) -> float:
    c = count.detach().double().cpu().reshape(1)
    if dist.get_world_size(group) > 1:
        dist.all_reduce(c, group=group)
    return float(c.item())


@dataclass
class MiniBatch:
    """One optimizer step's data: its micro-batches and dp-global normalisers."""

    micro_batches: list[dict[str, Tensor]]
    denominator: float  # the loss-aggregation denominator over all dp ranks
    tokens: float  # response tokens over all dp ranks


def _mini_batches(
    engine: Engine,
    tensors: dict[str, Tensor],
    total: int,
    config: ActorConfig | CriticConfig,
    sizes: BatchSizes,
    seed: int,
    where: str,
    count: bool = True,
) -> Iterator[MiniBatch]:
    """The mini-batches of every PPO epoch, gradients zeroed before each is yielded.

    ``total`` is the number of rows (a pipeline stage may hold metadata only, no
    columns); with ``count=False`` the dp-global normalisers are not computed (a stage
    without the loss skips that collective).
    """
    _check_batch(where, total, sizes)
    group = engine.dp_group
    engine.train_mode()
    for order in _orders(total, config.ppo_epochs, config.shuffle, seed):
        for start in range(0, total, sizes.mini_batch_size):
            idx = order[start : start + sizes.mini_batch_size]
            mini = {k: v[idx] for k, v in tensors.items()}
            denominator = tokens = 0.0
            if count:
                mask_all = response_mask_of(mini).float()
                denominator = _global_count(
                    agg_loss_denominator(mask_all, config.loss_agg_mode), group
                )
                tokens = _global_count(mask_all.sum(), group)
            engine.zero_grad()
            micros = [
                {k: v[sl] for k, v in mini.items()}
                for sl in micro_slices(sizes.mini_batch_size, sizes.micro_batch_size)
            ]
            yield MiniBatch(micros, denominator, tokens)


@dataclass(frozen=True)
class Role:
    """What the policy and the critic put into the PPO loop (:func:`run_ppo`).

    ``head(micro)`` maps the model's output for ``micro`` (logits or values) to what
    ``loss(output, micro, denominator, meter)`` takes; ``per_token`` names the metrics
    whose step sums are divided by the step's token count; ``grad_norm`` names the
    gradient norm; ``constants`` are added to the result as they are.
    """

    head: Callable[[dict[str, Tensor]], Callable[[Tensor], Any]]
    loss: Callable[[Any, dict[str, Tensor], float, Meter], Tensor]
    per_token: tuple[str, ...]
    grad_norm: str
    constants: dict[str, float] = field(default_factory=dict)

    def close_step(self, meter: Meter, tokens: float, grad_norm: float) -> None:
        per_token = {k: max(tokens, 1.0) for k in self.per_token}
        meter.close_step(per_token, {self.grad_norm: grad_norm})


#: ``(mini-batch, role, meter, grad_scale)``: forward and backward of the mini-batch's
#: micro-batches, gradients accumulated (no optimizer step), metrics into ``meter``
Accumulate = Callable[[MiniBatch, Role, Meter, float], None]


def run_ppo(
    engine: Engine,
    tensors: dict[str, Tensor],
    total: int,
    config: ActorConfig | CriticConfig,
    sizes: BatchSizes,
    seed: int,
    where: str,
    role: Role,
    accumulate: Accumulate,
    has_loss: bool = True,
) -> dict[str, float]:
    """The PPO loop of the actor and the critic, plain or pipelined: ``config.ppo_epochs``
    passes over the ``total`` rows in mini-batches (shuffled by ``seed`` with
    ``config.shuffle``), each mini-batch's micro-batches accumulated by ``accumulate``,
    then one optimizer step; the metrics are averaged over the steps.

    Each loss term is divided by the *global* token (or sequence) count of the mini-batch
    (counted over the dp group) and multiplied by the number of ranks FSDP averages
    gradients over (:attr:`Engine.grad_average_ranks`: dp x sp), so the update equals the
    one a single process would make on the whole mini-batch. With Ulysses sequence
    parallelism every sp rank computes the same loss on the gathered full-sequence logits
    and its parameters receive the gradient of its own shard of positions only; FSDP sums
    the shards' gradients. A rank without the loss (``has_loss=False``: a pipeline stage
    before the last) takes the optimizer steps and adds no loss metrics.
    """
    grad_scale = engine.grad_average_ranks
    meter = Meter(engine.dp_group)
    batches = _mini_batches(engine, tensors, total, config, sizes, seed, where, count=has_loss)
    for mb in batches:
        accumulate(mb, role, meter, grad_scale)
        grad_norm = engine.optimizer_step(config.grad_clip)
        if has_loss:
            role.close_step(meter, mb.tokens, grad_norm)
    metrics = meter.result()
    if has_loss:
        metrics.update(role.constants)
    return metrics
