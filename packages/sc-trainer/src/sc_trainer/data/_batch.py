"""A kept prompt (:class:`TokenizedPrompt`) and how prompts become a batch
(:func:`prompt_batch`): left-padded token tensors (:func:`left_padded`, which the built-in
tasks' prompts use too) and the columns the reward reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from sc_protocol import DataProto

__all__ = ["TokenizedPrompt", "left_padded", "object_column", "prompt_batch"]


@dataclass(frozen=True)
class TokenizedPrompt:
    """One kept row of a dataset: its token ids (already cut to the length limit) and what
    the reward function is given with it."""

    row_index: int
    input_ids: tuple[int, ...]
    prompt_text: str
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any] | None
    ability: str | None

    def as_dict(self) -> dict[str, Any]:
        """The prompt's fields, ``input_ids`` as a list."""
        return {
            "row_index": self.row_index,
            "input_ids": list(self.input_ids),
            "prompt_text": self.prompt_text,
            "data_source": self.data_source,
            "ground_truth": self.ground_truth,
            "extra_info": self.extra_info,
            "ability": self.ability,
        }


def object_column(values: Sequence[Any]) -> NDArray[np.object_]:
    """A 1-d numpy object column of ``values``, one element each (``np.array`` would make a
    2-d array of ground truths that are lists of one length)."""
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column


def left_padded(
    rows: Sequence[Sequence[int]], width: int, pad_token_id: int
) -> dict[str, torch.Tensor]:
    """``input_ids``, each row of token ids left-padded with ``pad_token_id`` to ``width``;
    ``attention_mask``, 1 on the tokens; ``position_ids``, counted from each row's first
    token. Each ``[len(rows), width]``."""
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
        attention_mask[i, width - len(ids) :] = 1
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
    }


def prompt_batch(
    prompts: Sequence[TokenizedPrompt],
    *,
    uids: Sequence[str],
    width: int,
    pad_token_id: int,
    meta_info: Mapping[str, Any],
) -> DataProto:
    """One row per prompt: ``input_ids``, ``attention_mask`` and ``position_ids``, each
    ``[rows, width]`` and left-padded with ``pad_token_id``; the non-tensor columns ``uid``,
    ``data_source``, ``ground_truth``, ``extra_info``, ``ability``, ``prompt_text`` and
    ``row_index``; ``meta_info``."""
    return DataProto.from_dict(
        tensors=left_padded([p.input_ids for p in prompts], width, pad_token_id),
        non_tensors={
            "uid": object_column(list(uids)),
            "data_source": object_column([p.data_source for p in prompts]),
            "ground_truth": object_column([p.ground_truth for p in prompts]),
            "extra_info": object_column([p.extra_info for p in prompts]),
            "ability": object_column([p.ability for p in prompts]),
            "prompt_text": object_column([p.prompt_text for p in prompts]),
            "row_index": object_column([p.row_index for p in prompts]),
        },
        meta_info=dict(meta_info),
    )
