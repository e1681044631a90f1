"""The per-rank PPO computations behind the worker methods (actor and critic)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .._config import ActorConfig, BatchSizes, CriticConfig
from .._errors import BatchError, MissingBatchKeyError
from ..algos import (
    agg_loss,
    agg_loss_denominator,
    compute_policy_loss,
    compute_value_loss,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
)
from ..engine import Engine

__all__ = [
    "compute_log_prob",
    "compute_values",
    "gather_tensors",
    "update_critic",
    "update_policy",
]


def gather_tensors(
    data: Any, keys: Sequence[str], optional: Sequence[str], where: str
) -> dict[str, Tensor]:
    """The named tensor columns of a DataProto; :class:`MissingBatchKeyError` names the absent."""
    batch: Any = getattr(data, "batch", None)
    available = [] if batch is None else [str(k) for k in batch.keys()]  # noqa: SIM118
    missing = [k for k in keys if k not in available]
    if missing:
        raise MissingBatchKeyError(
            f"{where}: the batch has no {missing}; it has {sorted(available)}"
        )
    out: dict[str, Tensor] = {}
    for key in [*keys, *(k for k in optional if k in available)]:
        value = batch[key]
        if not isinstance(value, Tensor):
            raise BatchError(f"{where}: column {key!r} is a {type(value).__name__}, not a tensor")
        out[key] = value
    rows = {k: int(v.shape[0]) for k, v in out.items()}
    if len(set(rows.values())) > 1:
        raise BatchError(f"{where}: columns have different row counts {rows}")
    return out


def response_mask_of(tensors: dict[str, Tensor]) -> Tensor:
    """``response_mask`` if given, else the response part of ``attention_mask``."""
    if "response_mask" in tensors:
        return tensors["response_mask"]
    length = tensors["responses"].shape[1]
    return tensors["attention_mask"][:, -length:]


def _micro_slices(total: int, size: int) -> Iterator[slice]:
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


def _response_logits(engine: Engine, t: dict[str, Tensor], temperature: float) -> Tensor:
    logits = engine.forward(t["input_ids"], t["attention_mask"], t["position_ids"])
    length = t["responses"].shape[1]
    return logits[:, -length - 1 : -1, :].float() / temperature


def compute_log_prob(
    engine: Engine,
    tensors: dict[str, Tensor],
    temperature: float,
    micro_batch_size: int,
    calculate_entropy: bool = True,
) -> tuple[Tensor, Tensor]:
    """Log-probabilities and entropies of the response tokens, ``[batch, response_length]``."""
    engine.eval_mode()
    total = tensors["input_ids"].shape[0]
    log_probs: list[Tensor] = []
    entropies: list[Tensor] = []
    with torch.no_grad():
        for sl in _micro_slices(total, micro_batch_size):
            micro = {k: v[sl] for k, v in tensors.items()}
            logits = _response_logits(engine, micro, temperature)
            labels = micro["responses"].to(logits.device)
            log_probs.append(logprobs_from_logits(logits, labels).cpu())
            if calculate_entropy:
                entropies.append(entropy_from_logits(logits).cpu())
    log_prob = torch.cat(log_probs) if log_probs else torch.zeros(0)
    entropy = torch.cat(entropies) if entropies else torch.zeros_like(log_prob)
    return log_prob, entropy


def compute_values(engine: Engine, tensors: dict[str, Tensor], micro_batch_size: int) -> Tensor:
    """Value predictions for the response tokens, zero outside ``response_mask``."""
    engine.eval_mode()
    total = tensors["input_ids"].shape[0]
    out: list[Tensor] = []
    with torch.no_grad():
        for sl in _micro_slices(total, micro_batch_size):
            micro = {k: v[sl] for k, v in tensors.items()}
            values = engine.forward(
                micro["input_ids"], micro["attention_mask"], micro["position_ids"]
            )
            length = micro["responses"].shape[1]
            values = values[:, -length - 1 : -1].float().cpu()
            out.append(values * response_mask_of(micro).to(values.dtype))
    return torch.cat(out)


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


class _Meter:
    """Sums of metrics per mini-batch, reduced over the dp group, averaged over steps."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.steps: dict[str, list[float]] = defaultdict(list)
        self._sums: dict[str, Tensor] = {}

    def add(self, name: str, value: Tensor) -> None:
        v = value.detach().double().cpu()
        self._sums[name] = self._sums.get(name, torch.zeros((), dtype=torch.float64)) + v

    def merge(self, other: _Meter) -> None:
        """Add ``other``'s sums (of the current step) to this meter's."""
        for name, value in other._sums.items():
            self.add(name, value)

    def close_step(self, weights: dict[str, float], extra: dict[str, float]) -> None:
        """All-reduce the sums over dp; each metric is divided by its weight."""
        names = sorted(self._sums)
        if names:
            packed = torch.stack([self._sums[n] for n in names])
            if dist.get_world_size(self.group) > 1:
                dist.all_reduce(packed, group=self.group)
            for n, v in zip(names, packed.tolist(), strict=True):
                self.steps[n].append(v / weights.get(n, 1.0))
        for n, v in extra.items():
            self.steps[n].append(v)
        self._sums = {}

    def result(self) -> dict[str, float]:
        return {k: sum(v) / len(v) for k, v in self.steps.items() if v}


def _global_count(count: Tensor, group: dist.ProcessGroup) -> float:
    c = count.detach().double().cpu().reshape(1)
    if dist.get_world_size(group) > 1:
        dist.all_reduce(c, group=group)
    return float(c.item())


@dataclass
class _MiniBatch:
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
) -> Iterator[_MiniBatch]:
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
                for sl in _micro_slices(sizes.mini_batch_size, sizes.micro_batch_size)
            ]
            yield _MiniBatch(micros, denominator, tokens)


def policy_loss(
    log_prob: Tensor,
    entropy_tokens: Tensor,
    micro: dict[str, Tensor],
    config: ActorConfig,
    denominator: float,
    meter: _Meter,
) -> Tensor:
    """One micro-batch's PPO loss (its share of the mini-batch's, by ``denominator``);
    its metrics go to ``meter``."""
    dev = log_prob.device
    mode = config.loss_agg_mode
    mask = response_mask_of(micro).to(dev).float()
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(
        micro["old_log_probs"].to(dev).float(),
        log_prob,
        micro["advantages"].to(dev).float(),
        mask,
        cliprange=config.clip_ratio,
        cliprange_low=config.cliprange_low,
        cliprange_high=config.cliprange_high,
        clip_ratio_c=config.clip_ratio_c,
        loss_agg_mode=mode,
        denominator=denominator,
    )
    loss = pg_loss
    entropy = agg_loss(entropy_tokens, mask, mode, denominator)
    if config.entropy_coeff != 0:
        loss = loss - config.entropy_coeff * entropy
    if config.use_kl_loss:
        kld = kl_penalty(log_prob, micro["ref_log_prob"].to(dev).float(), config.kl_loss_type)
        kl_loss = agg_loss(kld, mask, mode, denominator)
        loss = loss + config.kl_loss_coef * kl_loss
        meter.add("actor/kl_loss", kl_loss)
    n_tok = mask.sum()
    meter.add("actor/pg_loss", pg_loss)
    meter.add("actor/entropy", entropy)
    meter.add("actor/pg_clipfrac", clipfrac * n_tok)
    meter.add("actor/ppo_kl", ppo_kl * n_tok)
    meter.add("actor/pg_clipfrac_lower", clipfrac_lower * n_tok)
    return loss


def close_policy_step(meter: _Meter, tokens: float, grad_norm: float) -> None:
    per_token = {
        k: max(tokens, 1.0)
        for k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")
    }
    meter.close_step(per_token, {"actor/grad_norm": grad_norm})


def value_loss(
    vpreds: Tensor,
    micro: dict[str, Tensor],
    config: CriticConfig,
    denominator: float,
    meter: _Meter,
) -> Tensor:
    """One micro-batch's clipped value loss; its metrics go to ``meter``."""
    dev = vpreds.device
    mask = response_mask_of(micro).to(dev).float()
    vf_loss, vf_clipfrac = compute_value_loss(
        vpreds,
        micro["returns"].to(dev).float(),
        micro["values"].to(dev).float(),
        mask,
        config.cliprange_value,
        config.loss_agg_mode,
        denominator,
    )
    n_tok = mask.sum()
    meter.add("critic/vf_loss", vf_loss)
    meter.add("critic/vf_clipfrac", vf_clipfrac * n_tok)
    meter.add("critic/vpred_mean", (vpreds.detach() * mask).sum())
    return vf_loss


def close_value_step(meter: _Meter, tokens: float, grad_norm: float) -> None:
    per_token = {k: max(tokens, 1.0) for k in ("critic/vf_clipfrac", "critic/vpred_mean")}
    meter.close_step(per_token, {"critic/grad_norm": grad_norm})


def update_policy(
    engine: Engine,
    tensors: dict[str, Tensor],
    config: ActorConfig,
    sizes: BatchSizes,
    temperature: float,
    seed: int,
    where: str,
) -> dict[str, float]:
    """PPO epochs over mini-batches with gradient accumulation over micro-batches.

    Each loss term is divided by the *global* token (or sequence) count of the mini-batch
    (counted over the dp group) and multiplied by the number of ranks FSDP averages
    gradients over (:attr:`Engine.grad_average_ranks`: dp x sp), so the update equals the
    one a single process would make on the whole mini-batch. With Ulysses sequence
    parallelism every sp rank computes the same loss on the gathered full-sequence logits
    and its parameters receive the gradient of its own shard of positions only; FSDP sums
    the shards' gradients.
    """
    grad_scale = engine.grad_average_ranks
    meter = _Meter(engine.dp_group)
    total = tensors["input_ids"].shape[0]
    for mb in _mini_batches(engine, tensors, total, config, sizes, seed, where):
        for micro in mb.micro_batches:
            logits = _response_logits(engine, micro, temperature)
            log_prob = logprobs_from_logits(logits, micro["responses"].to(logits.device))
            entropy = entropy_from_logits(logits)
            loss = policy_loss(log_prob, entropy, micro, config, mb.denominator, meter)
            torch.autograd.backward(loss * grad_scale)
        close_policy_step(meter, mb.tokens, engine.optimizer_step(config.grad_clip))
    metrics = meter.result()
    if config.use_kl_loss:
        metrics["actor/kl_coef"] = config.kl_loss_coef
    return metrics


def update_critic(
    engine: Engine,
    tensors: dict[str, Tensor],
    config: CriticConfig,
    sizes: BatchSizes,
    seed: int,
    where: str,
) -> dict[str, float]:
    """Clipped value-loss epochs over mini-batches (same normalisation as the actor)."""
    grad_scale = engine.grad_average_ranks
    meter = _Meter(engine.dp_group)
    total = tensors["input_ids"].shape[0]
    for mb in _mini_batches(engine, tensors, total, config, sizes, seed, where):
        for micro in mb.micro_batches:
            out = engine.forward(micro["input_ids"], micro["attention_mask"], micro["position_ids"])
            length = micro["responses"].shape[1]
            vpreds = out[:, -length - 1 : -1].float()
            loss = value_loss(vpreds, micro, config, mb.denominator, meter)
            torch.autograd.backward(loss * grad_scale)
        close_value_step(meter, mb.tokens, engine.optimizer_step(config.grad_clip))
    return meter.result()
