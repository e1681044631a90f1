"""A dataset's prompts as the rollout sources read them (:class:`DatasetPrompts`): each
step's batch a pure function of the data, the seed and the step."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray
from sc_protocol import DataProto

from .._errors import DatasetError, TrainerConfigError, int_at_least
from ._dataset import PromptDataset

__all__ = ["DatasetPrompts"]


def _count(name: str, value: object, least: int) -> int:
    return int_at_least(value, least, f"DatasetPrompts: {name}")


class DatasetPrompts:
    """Each step's prompts of ``train`` and the held-out ones of ``val``: a
    :class:`~sc_trainer.rollout.PromptSource`.

    Steps count from 1 and walk epochs of ``steps_per_epoch = len(train) // batch_size``
    batches of ``batch_size`` prompts (the last, incomplete batch of an epoch is dropped, as a
    ``DataLoader`` with ``drop_last``): step ``s`` is batch ``(s - 1) % steps_per_epoch`` of
    epoch ``(s - 1) // steps_per_epoch``. An epoch's order is the dataset's order, or with
    ``shuffle`` the permutation ``np.random.default_rng([seed, epoch]).permutation(len(train))``,
    so the prompts of a step depend on the data, the seed and the step only: a resumed or
    replayed step gets the same rows (:attr:`fingerprint` and :meth:`position` let a
    checkpoint check that).

    :meth:`train_batch` holds each prompt ``responses_per_prompt`` times in a row, the
    repeats sharing a ``uid`` (``s<step>-<row_index>``); :meth:`val_batch` holds every
    prompt of ``val`` once (``uid`` ``val-<row_index>``), ``meta_info={"do_sample": False}``.
    Tensor columns ``input_ids``, ``attention_mask``, ``position_ids``, each ``[rows,
    max_prompt_length]``, left-padded with ``pad_token_id`` (the train tokenizer's pad token
    by default, else its eos), ``position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)``;
    numpy object columns ``uid``, ``data_source`` (the dataset's ``reward_fn_key`` column),
    ``ground_truth`` (``reward_model.ground_truth``), ``extra_info`` (a dict or None),
    ``ability``, ``prompt_text`` (the text the tokenizer was given, after the chat template)
    and ``row_index`` (the row's index in the rows read).

    Raises :class:`DatasetError` when ``train`` keeps fewer prompts than one batch, and from
    :meth:`val_batch` when there is no ``val``; :class:`~sc_trainer.TrainerConfigError` for a
    setting out of range or a step below 1.
    """

    def __init__(
        self,
        train: PromptDataset,
        val: PromptDataset | None = None,
        *,
        batch_size: int,
        responses_per_prompt: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        pad_token_id: int | None = None,
    ) -> None:
        self.train = train
        self.val = val
        self.batch_size = _count("batch_size", batch_size, 1)
        self.responses_per_prompt = _count("responses_per_prompt", responses_per_prompt, 1)
        self.seed = _count("seed", seed, 0)
        self.shuffle = shuffle
        pad = train.pad_token_id if pad_token_id is None else pad_token_id
        if pad is None:
            raise TrainerConfigError(
                "DatasetPrompts: the tokenizer has neither a pad nor an eos token; give "
                "pad_token_id"
            )
        self.pad_token_id: int = _count("pad_token_id", pad, 0)
        if len(train) < batch_size:
            stats = train.stats
            raise DatasetError(
                f"{', '.join(train.files)}: the training data keeps {stats.kept} prompts "
                f"(of {stats.read} rows read, {stats.filtered} filtered as longer than "
                f"max_prompt_length={train.max_prompt_length}), fewer than one batch of "
                f"batch_size={batch_size}"
            )
        #: full batches in one epoch (an incomplete last batch is dropped)
        self.steps_per_epoch = len(train) // batch_size
        self._order: tuple[int, NDArray[np.int64]] | None = None

    @property
    def fingerprint(self) -> str:
        """The training data's :attr:`PromptDataset.fingerprint`."""
        return self.train.fingerprint

    def order(self, epoch: int) -> NDArray[np.int64]:
        """The prompts of ``train`` (their indices in it) in epoch ``epoch``'s order."""
        _count("epoch", epoch, 0)
        cached = self._order
        if cached is not None and cached[0] == epoch:
            return cached[1]
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch])
            order = rng.permutation(len(self.train)).astype(np.int64)
        else:
            order = np.arange(len(self.train), dtype=np.int64)
        self._order = (epoch, order)
        return order

    def indices(self, step: int) -> list[int]:
        """The prompts of step ``step``'s batch, as indices in ``train``."""
        position = self.position(step)
        start = position["batch"] * self.batch_size
        return [int(i) for i in self.order(position["epoch"])[start : start + self.batch_size]]

    def position(self, step: int) -> dict[str, int]:
        """Where step ``step`` is in the data, for a checkpoint: ``step``, ``epoch``,
        ``batch`` (its index in the epoch), ``steps_per_epoch`` and ``rows_consumed`` (the
        prompts drawn through this step, each counted once: ``step * batch_size``)."""
        _count("step", step, 1)
        epoch, batch = divmod(step - 1, self.steps_per_epoch)
        return {
            "step": step,
            "epoch": epoch,
            "batch": batch,
            "steps_per_epoch": self.steps_per_epoch,
            "rows_consumed": step * self.batch_size,
        }

    def train_batch(self, step: int) -> DataProto:
        indices = self.indices(step)
        batch = self.train.batch(
            indices,
            uid_prefix=f"s{step}",
            pad_token_id=self.pad_token_id,
            meta_info={"global_step": step},
        )
        return batch.repeat(repeat_times=self.responses_per_prompt, interleave=True)

    def val_batch(self) -> DataProto:
        if self.val is None:
            raise DatasetError(
                "DatasetPrompts.val_batch: no validation data (no val dataset was given: "
                "set data.val_files)"
            )
        meta: dict[str, Any] = {"do_sample": False}
        return self.val.batch(
            range(len(self.val)), uid_prefix="val", pad_token_id=self.pad_token_id, meta_info=meta
        )
