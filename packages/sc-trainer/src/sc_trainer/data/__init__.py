"""Prompt datasets in verl's schema, as the rollout sources read them.

A verl user's parquet files (or an OpenRLHF or slime user's JSON-lines files) hold one row
per prompt: ``data_source``, ``prompt`` (a list of chat messages or a string), ``ability``,
``reward_model`` (``{"style": "rule", "ground_truth": ...}``) and ``extra_info``.
:func:`load_rows` reads them; :class:`PromptDataset` tokenizes the prompts (chat messages
through the tokenizer's chat template), filters or truncates the long ones and checks that
every row has a ground truth, counting what it did in :class:`DatasetStats`;
:class:`DatasetPrompts` makes each step's batch (a
:class:`~sc_trainer.rollout.PromptSource`), a pure function of the data, the seed and the
step, so that a resumed run trains on the same prompts.

Errors: :class:`DatasetNotFoundError` for a data file that does not exist,
:class:`DatasetError` for a file or a row that cannot be used (the message names the file,
the row and the value).
"""

from __future__ import annotations

from sc_dispatch import _public

from .._errors import DatasetError, DatasetNotFoundError
from ._dataset import DatasetStats, PromptDataset
from ._files import load_rows
from ._source import DatasetPrompts

__all__ = [
    "DatasetError",
    "DatasetNotFoundError",
    "DatasetPrompts",
    "DatasetStats",
    "PromptDataset",
    "load_rows",
]

_public.publish(globals())
