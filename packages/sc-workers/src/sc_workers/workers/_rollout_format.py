"""The rollout batch format: the tensors every producer of a rollout batch returns.

``generate_sequences`` on the workers, the trainer's router rollout and its agent sessions
all lay their rows out here, so that the stages after them (log-probs, the losses, the
metrics) read one format: ``prompts`` (left-padded), ``responses`` (right-padded),
``input_ids`` (the two side by side), ``attention_mask``, ``position_ids`` (the response's
continuing the prompt's last position), ``response_mask`` (the tokens the losses count) and
``rollout_log_probs`` (the sampling policy's log-prob of each response token).

One optional column is not in :data:`ROLLOUT_KEYS`: ``banned_token_ids``, int64
``[rows, response_length, K]``, the tokens each response token's sampling banned
(``SamplingParams.banned_token_ids``, e.g. an agent's tool budget), padded with -1 (a token
with nothing banned is all -1; ``K`` is the most ids any token of the batch had banned). A
producer adds it only when some token's sampling banned tokens (the trainer's agent batch
does); the actor's ``compute_log_prob``, ``compute_ref_log_prob`` and ``update_actor`` then
renormalise the model's distribution over the allowed tokens at each position, as the
sampler did, so ``rollout_log_probs`` and the actor's log-probs describe one policy.
Absent, they compute the model's own distribution, as before.
"""

from __future__ import annotations

import torch

__all__ = ["ROLLOUT_KEYS", "rollout_tensors"]

#: the tensor keys of a rollout batch, in the order :func:`rollout_tensors` returns them
ROLLOUT_KEYS = (
    "prompts",
    "responses",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "rollout_log_probs",
)


def rollout_tensors(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_positions: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    *,
    response_attention: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The rollout batch's tensors (see the module's documentation) from the prompt side
    (``[rows, prompt_length]`` ids, attention mask and positions) and the response side
    (``[rows, response_length]`` token ids, response mask and log-probs).

    ``response_attention``: which response tokens the model attends to, when that is more
    than the tokens the losses count (an agent session's tool tokens); ``None``: the
    response mask. The masks take the prompt mask's dtype.
    """
    mask = response_mask.to(prompt_mask.dtype)
    attended = mask if response_attention is None else response_attention.to(prompt_mask.dtype)
    length = responses.shape[1]
    delta = torch.arange(1, length + 1, dtype=prompt_positions.dtype)
    return {
        "prompts": prompt_ids,
        "responses": responses,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, attended], dim=1),
        "position_ids": torch.cat(
            [prompt_positions, prompt_positions[:, -1:] + delta[None, :]], dim=1
        ),
        "response_mask": mask,
        "rollout_log_probs": rollout_log_probs,
    }
