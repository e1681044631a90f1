"""The per-rank PPO computations behind the worker methods (actor and critic): scoring,
and the policy and value losses that the shared loop of :mod:`._ppo_loop` runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .._config import ActorConfig, BatchSizes, CriticConfig
from .._errors import BatchError, MissingBatchKeyError
from ..algos import (
    agg_loss,
    ban_logits_,
    compute_policy_loss,
    compute_value_loss,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
)
from ..engine import Engine
from ..models import rows_forward
from ._ppo_loop import Accumulate, Meter, MiniBatch, Role, micro_slices, response_mask_of, run_ppo

__all__ = [
    "BANNED",
    "check_banned",
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


#: the optional rollout column of the tokens each response token's sampling banned
BANNED = "banned_token_ids"


def check_banned(tensors: dict[str, Tensor], where: str) -> None:
    """A ``banned_token_ids`` column, when present, is int64 ``[batch, response_length, K]``
    (``responses``' rows and length; -1 pads); a :class:`BatchError` otherwise."""
    banned = tensors.get(BANNED)
    if banned is None or "responses" not in tensors:
        return
    shape = tuple(tensors["responses"].shape)
    if banned.dtype != torch.int64 or banned.dim() != 3 or tuple(banned.shape[:2]) != shape:
        raise BatchError(
            f"{where}: column {BANNED!r} must be int64 [batch, response_length, K] with "
            f"[batch, response_length] = {list(shape)}, got {banned.dtype} "
            f"{list(banned.shape)}"
        )


def _scaled_response_logits(
    logits: Tensor, responses: Tensor, temperature: float, banned: Tensor | None
) -> Tensor:
    """The logits that predict the response tokens, float32, over ``temperature``; with
    ``banned`` (``[batch, response_length, K]``), its tokens banned (:func:`ban_logits_`):
    the distribution the sampler drew from, renormalised over the allowed tokens."""
    length = responses.shape[1]
    scaled = logits[:, -length - 1 : -1, :].float() / temperature  # a new tensor: banned in place
    if banned is not None:
        ban_logits_(scaled, banned, responses)
    return scaled


def _forward(engine: Engine, t: dict[str, Tensor], exact_window: int, where: str) -> Tensor:
    """The engine's forward over a micro-batch (:func:`rows_forward`)."""
    ids, mask, positions = t["input_ids"], t["attention_mask"], t["position_ids"]
    return rows_forward(engine.forward, ids, mask, positions, exact_window, where)


def _response_logits(
    engine: Engine, t: dict[str, Tensor], temperature: float, exact_window: int
) -> Tensor:
    logits = _forward(engine, t, exact_window, "compute_log_prob")
    return _scaled_response_logits(logits, t["responses"], temperature, t.get(BANNED))


def response_head(
    responses: Tensor, temperature: float, banned: Tensor | None = None
) -> Callable[[Tensor], Any]:
    """logits -> (log-probs, entropies) of the response tokens; with ``banned`` (the batch's
    ``banned_token_ids`` rows), of the distribution renormalised over the allowed tokens,
    entropies included (a banned token adds nothing to an entropy)."""

    def head(logits: Tensor) -> tuple[Tensor, Tensor]:
        scaled = _scaled_response_logits(logits, responses, temperature, banned)
        log_prob = logprobs_from_logits(scaled, responses.to(scaled.device))
        # copies, not views of the stage's output (FSDP hooks a stage's outputs)
        return log_prob.clone(), entropy_from_logits(scaled).clone()

    return head


def value_head(length: int) -> Callable[[Tensor], Tensor]:
    """values -> the values of the positions that predict the response tokens."""

    def head(values: Tensor) -> Tensor:
        return values[:, -length - 1 : -1].float().clone()

    return head


def compute_log_prob(
    engine: Engine,
    tensors: dict[str, Tensor],
    temperature: float,
    micro_batch_size: int,
    calculate_entropy: bool = True,
    exact_window: int = 0,
) -> tuple[Tensor, Tensor]:
    """Log-probabilities and entropies of the response tokens, ``[batch, response_length]``
    (``exact_window``: the exact mode, see :func:`window_forward`).

    With a ``banned_token_ids`` column in ``tensors`` (a rollout whose sampling banned
    tokens), both are those of the model's distribution renormalised over the tokens not
    banned at each position (:func:`~sc_workers.algos.ban_logits_`), the distribution the
    sampler drew from; without it, the model's own."""
    engine.eval_mode()
    total = tensors["input_ids"].shape[0]
    log_probs: list[Tensor] = []
    entropies: list[Tensor] = []
    with torch.no_grad():
        for sl in micro_slices(total, micro_batch_size):
            micro = {k: v[sl] for k, v in tensors.items()}
            logits = _response_logits(engine, micro, temperature, exact_window)
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
        for sl in micro_slices(total, micro_batch_size):
            micro = {k: v[sl] for k, v in tensors.items()}
            values = engine.forward(
                micro["input_ids"], micro["attention_mask"], micro["position_ids"]
            )
            length = micro["responses"].shape[1]
            values = values[:, -length - 1 : -1].float().cpu()
            out.append(values * response_mask_of(micro).to(values.dtype))
    return torch.cat(out)


def policy_loss(
    log_prob: Tensor,
    entropy_tokens: Tensor,
    micro: dict[str, Tensor],
    config: ActorConfig,
    denominator: float,
    meter: Meter,
) -> Tensor:
    """One micro-batch's PPO loss (its share of the mini-batch's, by ``denominator``);
    its metrics go to ``meter``. ``log_prob`` and ``entropy_tokens`` come from the role's
    head, under the ``banned_token_ids`` column's renormalisation when the batch has one
    (:func:`response_head`). A ``rollout_is_weights`` column (the rollout correction's
    importance weights) multiplies the per-token policy-gradient loss."""
    dev = log_prob.device
    mode = config.loss_agg_mode
    mask = response_mask_of(micro).to(dev).float()
    old_log_prob = micro["old_log_probs"].to(dev).float()
    is_weights = micro.get("rollout_is_weights")
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(
        old_log_prob,
        log_prob,
        micro["advantages"].to(dev).float(),
        mask,
        cliprange=config.clip_ratio,
        cliprange_low=config.cliprange_low,
        cliprange_high=config.cliprange_high,
        clip_ratio_c=config.clip_ratio_c,
        loss_agg_mode=mode,
        denominator=denominator,
        rollout_is_weights=None if is_weights is None else is_weights.to(dev).float(),
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
    # only the response tokens: whatever the other positions hold (tool tokens) is left out
    deviation = (torch.exp(log_prob.detach() - old_log_prob) - 1.0).abs()
    ratio_dev = torch.where(mask.bool(), deviation, torch.zeros_like(deviation))
    meter.peak("actor/ppo_ratio_first_dev_max", ratio_dev.max() if ratio_dev.numel() else n_tok * 0)
    meter.add("actor/pg_loss", pg_loss)
    meter.add("actor/entropy", entropy)
    meter.add("actor/pg_clipfrac", clipfrac * n_tok)
    meter.add("actor/ppo_kl", ppo_kl * n_tok)
    meter.add("actor/pg_clipfrac_lower", clipfrac_lower * n_tok)
    return loss


def value_loss(
    vpreds: Tensor,
    micro: dict[str, Tensor],
    config: CriticConfig,
    denominator: float,
    meter: Meter,
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


def policy_role(config: ActorConfig, temperature: float) -> Role:
    """The actor's PPO loss on the response tokens' log-probabilities and entropies."""

    def loss(
        output: tuple[Tensor, Tensor], micro: dict[str, Tensor], denominator: float, meter: Meter
    ) -> Tensor:
        log_prob, entropy = output
        return policy_loss(log_prob, entropy, micro, config, denominator, meter)

    return Role(
        head=lambda micro: response_head(micro["responses"], temperature, micro.get(BANNED)),
        loss=loss,
        per_token=("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"),
        grad_norm="actor/grad_norm",
        constants={"actor/kl_coef": config.kl_loss_coef} if config.use_kl_loss else {},
    )


def value_role(config: CriticConfig) -> Role:
    """The critic's clipped value loss on the response tokens' values."""

    def loss(vpreds: Tensor, micro: dict[str, Tensor], denominator: float, meter: Meter) -> Tensor:
        return value_loss(vpreds, micro, config, denominator, meter)

    return Role(
        head=lambda micro: value_head(int(micro["responses"].shape[1])),
        loss=loss,
        per_token=("critic/vf_clipfrac", "critic/vpred_mean"),
        grad_norm="critic/grad_norm",
    )


def micro_batch_steps(engine: Engine, exact_window: int = 0) -> Accumulate:
    """One forward and backward per micro-batch on an unpipelined engine (in the exact
    mode, ``exact_window`` > 0, the forward runs each row alone in its window)."""

    def accumulate(mb: MiniBatch, role: Role, meter: Meter, grad_scale: float) -> None:
        for micro in mb.micro_batches:
            out = _forward(engine, micro, exact_window, "update")
            loss = role.loss(role.head(micro)(out), micro, mb.denominator, meter)
            torch.autograd.backward(loss * grad_scale)

    return accumulate


def update_policy(
    engine: Engine,
    tensors: dict[str, Tensor],
    config: ActorConfig,
    sizes: BatchSizes,
    temperature: float,
    seed: int,
    where: str,
    exact_window: int = 0,
) -> dict[str, float]:
    """PPO epochs over mini-batches with gradient accumulation over micro-batches
    (:func:`run_ppo`; ``exact_window``: the exact mode)."""
    total = tensors["input_ids"].shape[0]
    role = policy_role(config, temperature)
    steps = micro_batch_steps(engine, exact_window)
    return run_ppo(engine, tensors, total, config, sizes, seed, where, role, steps)


def update_critic(
    engine: Engine,
    tensors: dict[str, Tensor],
    config: CriticConfig,
    sizes: BatchSizes,
    seed: int,
    where: str,
) -> dict[str, float]:
    """Clipped value-loss epochs over mini-batches (same loop as the actor's)."""
    total = tensors["input_ids"].shape[0]
    role = value_role(config)
    return run_ppo(
        engine, tensors, total, config, sizes, seed, where, role, micro_batch_steps(engine)
    )
