"""The user's own task: prompts from their dataset, rewards from their reward function.

:class:`DatasetTask` is what a run with ``data.train_files`` trains: its prompts are the
dataset's (:class:`~sc_trainer.data.DatasetPrompts`, tokenized by the model's tokenizer) and
each response is scored by the reward function (:class:`~sc_trainer.rewards.RewardScorer`,
verl's signature ``compute_score(data_source, solution_str, ground_truth, extra_info)``): the
response's text, decoded without special tokens, is the ``solution_str``, and the score is
paid on the response's last token (an outcome reward). A reward function's extra values
become ``reward/<name>`` metrics (their mean over the batch's rows), its failures counted in
``reward/failures`` when the run opted into counting them; otherwise a failure stops the run
naming the row.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from sc_protocol import DataProto

from .._errors import TaskError
from .._scores import BatchScores
from ..config import DataConfig, TrainerConfig
from ..data import DatasetPrompts, PromptDataset
from ..faults import RewardFaults
from ..rewards import RewardInput, RewardScorer, resolve_reward_function

__all__ = ["DatasetTask", "data_state"]

_COLUMNS = ("data_source", "ground_truth", "extra_info", "row_index")


def prompt_dataset(files: tuple[str, ...], data: DataConfig, tokenizer: Any) -> PromptDataset:
    """The prompts of ``files`` (``data.train_files`` or ``data.val_files``) through
    ``tokenizer``, kept, cut and checked as ``data`` says."""
    return PromptDataset.from_files(
        files,
        tokenizer,
        max_prompt_length=data.max_prompt_length,
        prompt_key=data.prompt_key,
        filter_overlong_prompts=data.filter_overlong_prompts,
        truncation=data.truncation,
        reward_fn_key=data.reward_fn_key,
    )


class DatasetTask:
    """The prompts and the reward of a dataset run (see the module's documentation), through
    ``tokenizer`` (the model's)."""

    def __init__(self, config: TrainerConfig, tokenizer: Any) -> None:
        data = config.data
        self.tokenizer = tokenizer
        self.train = prompt_dataset(data.train_files, data, tokenizer)
        self.val = prompt_dataset(data.val_files, data, tokenizer) if data.val_files else None
        self.prompts = DatasetPrompts(
            self.train,
            self.val,
            batch_size=config.prompts_per_step,
            responses_per_prompt=config.responses_per_prompt,
            seed=config.seed if data.seed is None else data.seed,
            shuffle=data.shuffle,
            pad_token_id=self.train.pad_token_id,
        )
        reward = config.reward
        label = f"{reward.path}:{reward.name}" if reward.path is not None else reward.name
        #: The run's injected reward faults (``inject_fault``), armed by the trainer.
        self.reward_faults = RewardFaults(config.reward_faults, reward.timeout_s)
        fn = resolve_reward_function(reward.path, reward.name)
        self.scorer = RewardScorer(
            self.reward_faults.wrap(fn) if config.reward_faults else fn,
            timeout_s=reward.timeout_s,
            max_workers=reward.max_workers,
            on_error=reward.on_error,
            label=label,
        )
        self.prompt_length = data.max_prompt_length
        self.response_length = data.max_response_length

    @property
    def steps_per_epoch(self) -> int:
        """Steps of one pass over the training prompts (the last incomplete batch dropped)."""
        return self.prompts.steps_per_epoch

    def score_batch(self, batch: DataProto) -> BatchScores:
        """Each row's reward on its last response token, and the ``reward/*`` metrics."""
        td: Any = batch.batch
        missing = [k for k in ("responses", "response_mask") if td is None or k not in td]
        missing += [k for k in _COLUMNS if k not in batch.non_tensor_batch]
        if missing:
            raise TaskError(
                f"DatasetTask.score_batch: the batch lacks {missing} (a rollout of the "
                "dataset's prompts holds them)"
            )
        responses, mask = td["responses"].cpu(), td["response_mask"].cpu()
        columns = batch.non_tensor_batch
        inputs = []
        for row in range(responses.shape[0]):
            ids = responses[row][mask[row].bool()].tolist()
            extra = columns["extra_info"][row]
            inputs.append(
                RewardInput(
                    data_source=str(columns["data_source"][row]),
                    solution_str=self.tokenizer.decode(ids, skip_special_tokens=True),
                    ground_truth=columns["ground_truth"][row],
                    extra_info=dict(extra) if isinstance(extra, dict) else None,
                    row=int(columns["row_index"][row]),
                )
            )
        outcome = self.scorer.score(self.reward_faults.apply(inputs))
        scores = torch.zeros(responses.shape, dtype=torch.float32)
        lengths = mask.long().sum(dim=1)
        for row, score in enumerate(outcome.scores):
            if lengths[row] > 0:
                scores[row, int(lengths[row]) - 1] = score
        metrics: dict[str, Any] = {}
        for name, values in outcome.extra.items():
            finite = [v for v in values if math.isfinite(v)]
            if finite:
                metrics[f"reward/{name}"] = float(np.mean(finite))
        if self.scorer.on_error == "count":
            metrics["reward/failures"] = outcome.failures
        return BatchScores(scores, metrics)

    def close(self) -> None:
        """Stop the reward function's threads."""
        self.scorer.close()


def data_state(task: object, step: int | None = None) -> dict[str, Any] | None:
    """What a checkpoint records of a dataset run's data: the training prompts' fingerprint
    and, after ``step``, the position (epoch, batch, rows consumed); ``None`` for a built-in
    task. Each step's batch is a function of the data, the seed and the step, so a resumed
    run sees exactly the samples an uninterrupted one would; the fingerprint makes sure it
    trains on the same data."""
    if not isinstance(task, DatasetTask):
        return None
    state: dict[str, Any] = {"fingerprint": task.prompts.fingerprint}
    if step is not None and step > 0:
        state["position"] = task.prompts.position(step)
    return state
