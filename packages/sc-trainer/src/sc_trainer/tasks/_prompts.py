"""A digit task's prompts as the rollout sources read them (:class:`TaskPrompts`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sc_protocol import DataProto

from ._digits import DigitsTask

__all__ = ["TaskPrompts"]


class TaskPrompts:
    """Each step's prompts of ``task`` (``prompts_per_step`` of its training strings, drawn
    from ``(seed, step)``, each repeated ``responses_per_prompt`` times) and its held-out
    ones: a :class:`~sc_trainer.rollout.PromptSource`."""

    def __init__(
        self, task: DigitsTask, prompts_per_step: int, responses_per_prompt: int, seed: int
    ) -> None:
        self.task = task
        self.prompts_per_step = prompts_per_step
        self.responses_per_prompt = responses_per_prompt
        self.seed = seed

    def batch(
        self, texts: Sequence[str] | np.ndarray, uid_prefix: str, meta: dict[str, Any]
    ) -> DataProto:
        """The prompt batch of ``texts``, one row each: the task's tokens, ``prompt_text``
        and a ``uid`` of ``uid_prefix`` and the row, and ``meta`` as ``meta_info``."""
        tensors = self.task.encode_prompts(texts)
        uids = np.array([f"{uid_prefix}-{i}" for i in range(len(texts))], dtype=object)
        return DataProto.from_dict(
            tensors=tensors,
            non_tensors={"prompt_text": np.asarray(texts, dtype=object), "uid": uids},
            meta_info=meta,
        )

    def train_batch(self, step: int) -> DataProto:
        texts = self.task.sample_train(self.prompts_per_step, self.seed, step)
        batch = self.batch(texts, f"s{step}", {"global_step": step})
        return batch.repeat(repeat_times=self.responses_per_prompt, interleave=True)

    def val_batch(self) -> DataProto:
        return self.batch(self.task.val_strings, "val", {"do_sample": False})
