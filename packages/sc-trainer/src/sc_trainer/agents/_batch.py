"""Agent sessions as a training batch: one row per session, in the rollout worker's format.

:func:`build_agent_batch` lays each :class:`sc_rollout.AgentOutcome` out as the rollout
worker's output row (``prompts`` left-padded, ``responses`` right-padded, ``input_ids``,
``attention_mask``, ``position_ids``, ``response_mask``, ``rollout_log_probs``), with one
difference that the losses rely on: ``attention_mask`` is 1 on every token of the session
(the model attends to the tool's tokens) while ``response_mask`` is 1 on the model's tokens
only, so tool tokens carry no gradient, no KL and no log-prob comparison. The tokens are the
session's own (never re-tokenized).

A dropped session (deadline, error, cancelled, or longer than the response length) keeps its
row, with no response tokens and ``response_mask`` all 0: it contributes nothing to a loss,
and its ``uid`` is its own, so it does not shift its group's GRPO mean. Its status is the
non-tensor column ``agent_status``; ``agent_reward`` holds each session's reward (0.0 when
dropped), which :func:`agent_token_scores` pays on the row's last model token.

When some kept session's turn banned tokens (``SamplingParams.banned_token_ids``, e.g. a
tool budget), the batch also has ``banned_token_ids``, int64 ``[rows, response_length, K]``
(``K``: the most ids any turn banned): each model token of such a turn holds its turn's
banned ids, padded with -1; every other position is all -1. The actor renormalises its
log-probs over the allowed tokens there, as the sampler did. Without a ban the column is
absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sc_protocol import DataProto
from sc_rollout import AgentOutcome
from sc_workers.workers import rollout_tensors

from .._errors import RolloutInputError, int_at_least

__all__ = ["agent_token_scores", "build_agent_batch"]

#: ``agent_status`` of a session whose response does not fit the batch's response length
TOO_LONG = "too_long"


def _fits(outcome: AgentOutcome, prompt_length: int, response_length: int) -> bool:
    rollout = outcome.rollout
    return (
        len(rollout["prompt_ids"]) <= prompt_length
        and len(rollout["response_ids"]) <= response_length
    )


def build_agent_batch(
    outcomes: Sequence[AgentOutcome],
    *,
    prompt_length: int,
    response_length: int,
    pad_token_id: int,
    meta_info: dict[str, Any] | None = None,
) -> DataProto:
    """The batch of ``outcomes``, a row each in order (see the module's documentation).

    ``prompt_length`` / ``response_length``: the padded widths (a session longer than
    either is dropped as ``"too_long"``). ``meta_info`` is the batch's, plus
    ``weight_version``: the oldest weight version any kept session ran under.
    """
    if not outcomes:
        raise RolloutInputError("build_agent_batch: no outcomes")
    for name, value in (("prompt_length", prompt_length), ("response_length", response_length)):
        int_at_least(value, 1, f"build_agent_batch: {name}", RolloutInputError)
    rows = len(outcomes)
    prompts = torch.full((rows, prompt_length), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, prompt_length), dtype=torch.long)
    responses = torch.full((rows, response_length), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((rows, response_length), dtype=torch.long)
    response_mask = torch.zeros((rows, response_length), dtype=torch.long)
    log_probs = torch.zeros((rows, response_length), dtype=torch.float32)
    status, uid, text, rewards, turns = [], [], [], [], []
    kept_rows: list[int] = []
    low = np.zeros(rows, dtype=np.int64)
    high = np.zeros(rows, dtype=np.int64)
    for row, outcome in enumerate(outcomes):
        rollout = outcome.rollout
        prompt = list(rollout["prompt_ids"])
        if len(prompt) > prompt_length:
            prompt = prompt[-prompt_length:]  # only for a row that is dropped below
        prompts[row, prompt_length - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[row, prompt_length - len(prompt) :] = 1
        kept = outcome.ok and _fits(outcome, prompt_length, response_length)
        state: str = outcome.status
        if outcome.ok and not kept:
            state = TOO_LONG
        status.append(state)
        text.append(str(outcome.task.data))
        rewards.append(outcome.reward if kept and outcome.reward is not None else 0.0)
        uid.append(outcome.task.group if kept else f"{outcome.task.group}/{row}:{state}")
        turns.append(sum(1 for s in rollout["segments"] if s["kind"] == "model"))
        versions = (rollout["weight_version_min"], rollout["weight_version_max"])
        low[row] = -1 if versions[0] is None else versions[0]
        high[row] = -1 if versions[1] is None else versions[1]
        if not kept:
            continue
        kept_rows.append(row)
        ids = rollout["response_ids"]
        count = len(ids)
        responses[row, :count] = torch.tensor(ids, dtype=torch.long)
        response_attention[row, :count] = 1
        response_mask[row, :count] = torch.tensor(rollout["response_mask"], dtype=torch.long)
        log_probs[row, :count] = torch.tensor(rollout["response_logprobs"], dtype=torch.float32)
    positions = (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)
    tensors = rollout_tensors(
        prompts,
        prompt_mask,
        positions,
        responses,
        response_mask,
        log_probs,
        response_attention=response_attention,  # tool tokens: attended, not in the loss
    )
    non_tensors = {
        "uid": np.array(uid, dtype=object),
        "prompt_text": np.array(text, dtype=object),
        "agent_status": np.array(status, dtype=object),
        "agent_reward": np.array(rewards, dtype=np.float64),
        "agent_turns": np.array(turns, dtype=np.int64),
        "weight_version_min": low,
        "weight_version_max": high,
    }
    banned = _banned_column(outcomes, kept_rows, response_length)
    if banned is not None:
        tensors["banned_token_ids"] = banned
    kept_versions = low[np.array([s == "done" for s in status])]
    meta = dict(meta_info or {})
    meta["weight_version"] = int(kept_versions.min()) if len(kept_versions) else int(low.max())
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def _banned_column(
    outcomes: Sequence[AgentOutcome], kept_rows: Sequence[int], response_length: int
) -> torch.Tensor | None:
    """``banned_token_ids`` of the kept rows' model turns (see the module's documentation);
    ``None`` when no turn banned a token."""
    bans: list[tuple[int, int, int, list[int]]] = []  # row, start, end, ids
    for row in kept_rows:
        for segment in outcomes[row].rollout["segments"]:
            ids = [int(i) for i in segment.get("banned_token_ids", ())]
            if segment["kind"] == "model" and ids and segment["token_ids"]:
                start = int(segment["start"])
                bans.append((row, start, start + len(segment["token_ids"]), ids))
    if not bans:
        return None
    width = max(len(ids) for *_, ids in bans)
    column = torch.full((len(outcomes), response_length, width), -1, dtype=torch.long)
    for row, start, end, ids in bans:
        column[row, start:end, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return column


def agent_token_scores(batch: DataProto) -> torch.Tensor:
    """``[rows, response_length]``: each row's ``agent_reward`` on its last model token
    (``response_mask`` 1), 0 elsewhere; a row without model tokens earns nothing."""
    td = batch.batch
    if td is None or "response_mask" not in td:
        raise RolloutInputError("agent_token_scores: the batch has no response_mask")
    if "agent_reward" not in batch.non_tensor_batch:
        raise RolloutInputError("agent_token_scores: the batch has no agent_reward column")
    mask = td["response_mask"]
    rewards = torch.as_tensor(
        np.asarray(batch.non_tensor_batch["agent_reward"], dtype=np.float64), dtype=torch.float32
    )
    out = torch.zeros(mask.shape, dtype=torch.float32)
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values
    has = last >= 0
    out[has.nonzero(as_tuple=True)[0], last[has]] = rewards[has]
    return out
