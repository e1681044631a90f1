"""The tokenized prompts of a dataset (:class:`PromptDataset`) and what reading it kept
(:class:`DatasetStats`)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sc_protocol import DataProto

from .._errors import DatasetError, TrainerConfigError
from ._batch import TokenizedPrompt, prompt_batch
from ._files import DataFiles, Origin, read_files, short
from ._tokenize import render_prompt

__all__ = ["DatasetStats", "PromptDataset", "Truncation"]

logger = logging.getLogger(__name__)

#: what to do with a prompt longer than ``max_prompt_length`` when it is not filtered out
Truncation = Literal["error", "left", "right"]
_TRUNCATIONS = ("error", "left", "right")
#: how many bad rows an error message quotes
_QUOTED = 5


@dataclass(frozen=True)
class DatasetStats:
    """What building a :class:`PromptDataset` did with its rows: ``read`` of them, ``kept``
    (in the dataset), ``filtered`` (dropped: longer than ``max_prompt_length`` with
    ``filter_overlong_prompts``) and ``truncated`` (kept, cut to ``max_prompt_length``)."""

    read: int
    kept: int
    filtered: int
    truncated: int


class PromptDataset:
    """The prompts of verl-schema rows, tokenized, each at most ``max_prompt_length`` tokens.

    ``rows`` are dicts with verl's keys (see :func:`load_rows`); ``origins`` names where each
    came from, ``(file, row in the file)``, for error messages (:meth:`from_files` fills it;
    without it rows are named ``<rows>``). ``tokenizer`` is a Hugging Face tokenizer or
    anything with ``encode(text, add_special_tokens=False)``, ``apply_chat_template``,
    ``chat_template``, ``bos_token_id``, ``pad_token_id`` and ``eos_token_id``. A prompt that
    is a list of chat messages is rendered with the chat template (``add_generation_prompt``)
    and that text encoded without special tokens; a string prompt is encoded as it is, with
    the tokenizer's bos first if it has one.

    A prompt longer than ``max_prompt_length`` tokens is dropped when
    ``filter_overlong_prompts`` (counted in ``stats.filtered``), else cut by ``truncation``:
    ``"left"`` keeps its last tokens, ``"right"`` its first (counted in
    ``stats.truncated``), ``"error"`` raises :class:`DatasetError`. ``reward_fn_key`` is the
    column that becomes ``data_source`` (the reward function is chosen by it); with
    ``require_ground_truth``, every row needs ``reward_model.ground_truth``.

    Raises :class:`DatasetError` naming the file, the row and the value: rows without ground
    truth or ``reward_fn_key`` (all of them counted, the first few quoted), a prompt that is
    malformed, cannot be rendered or tokenized, or is empty, one too long with
    ``truncation="error"``, and a dataset that keeps no row.
    """

    def __init__(
        self,
        rows: Sequence[Mapping[str, Any]],
        tokenizer: Any,
        *,
        max_prompt_length: int,
        prompt_key: str = "prompt",
        filter_overlong_prompts: bool = True,
        truncation: Truncation = "error",
        reward_fn_key: str = "data_source",
        require_ground_truth: bool = True,
        origins: Sequence[Origin] | None = None,
    ) -> None:
        if isinstance(max_prompt_length, bool) or not isinstance(max_prompt_length, int):
            raise TrainerConfigError(
                f"PromptDataset: max_prompt_length must be an int, got {max_prompt_length!r}"
            )
        if max_prompt_length < 1:
            raise TrainerConfigError(
                f"PromptDataset: max_prompt_length must be at least 1, got {max_prompt_length}"
            )
        if truncation not in _TRUNCATIONS:
            raise TrainerConfigError(
                f"PromptDataset: truncation must be one of {_TRUNCATIONS}, got {truncation!r}"
            )
        if origins is not None and len(origins) != len(rows):
            raise TrainerConfigError(f"PromptDataset: {len(origins)} origins for {len(rows)} rows")
        self.max_prompt_length = max_prompt_length
        self.prompt_key = prompt_key
        self.filter_overlong_prompts = filter_overlong_prompts
        self.truncation: Truncation = truncation
        self.reward_fn_key = reward_fn_key
        self.require_ground_truth = require_ground_truth
        self._origins: list[Origin] = (
            list(origins) if origins is not None else [("<rows>", i) for i in range(len(rows))]
        )
        #: the files the rows came from, in order, each once
        self.files: tuple[str, ...] = tuple(dict.fromkeys(f for f, _ in self._origins))
        pad = getattr(tokenizer, "pad_token_id", None)
        if not isinstance(pad, int):
            pad = getattr(tokenizer, "eos_token_id", None)
        #: the tokenizer's pad token id (its eos when it has no pad token), or None
        self.pad_token_id: int | None = pad if isinstance(pad, int) else None

        self._check_columns(rows)
        self._prompts: list[TokenizedPrompt] = []
        filtered = truncated = 0
        for i, row in enumerate(rows):
            prompt, cut = self._tokenize(i, row, tokenizer)
            if prompt is None:
                filtered += 1
                continue
            truncated += cut
            self._prompts.append(prompt)
        self.stats = DatasetStats(
            read=len(rows), kept=len(self._prompts), filtered=filtered, truncated=truncated
        )
        logger.info(
            "dataset %s: %d rows read, %d kept, %d filtered (longer than %d tokens), %d truncated",
            ", ".join(self.files) or "<empty>",
            self.stats.read,
            self.stats.kept,
            self.stats.filtered,
            self.max_prompt_length,
            self.stats.truncated,
        )
        if not self._prompts:
            raise DatasetError(
                f"{', '.join(self.files) or '<rows>'}: no row kept of {len(rows)} "
                f"({filtered} longer than max_prompt_length={max_prompt_length} tokens)"
            )
        self._fingerprint = _fingerprint(self._prompts)

    @classmethod
    def from_files(
        cls,
        files: DataFiles,
        tokenizer: Any,
        *,
        max_prompt_length: int,
        prompt_key: str = "prompt",
        filter_overlong_prompts: bool = True,
        truncation: Truncation = "error",
        reward_fn_key: str = "data_source",
        require_ground_truth: bool = True,
    ) -> PromptDataset:
        """The dataset of the rows of ``files`` (see :func:`load_rows`), each row named by
        its file in error messages."""
        rows, origins = read_files(files, prompt_key=prompt_key)
        return cls(
            rows,
            tokenizer,
            max_prompt_length=max_prompt_length,
            prompt_key=prompt_key,
            filter_overlong_prompts=filter_overlong_prompts,
            truncation=truncation,
            reward_fn_key=reward_fn_key,
            require_ground_truth=require_ground_truth,
            origins=origins,
        )

    def __len__(self) -> int:
        return len(self._prompts)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Kept prompt ``index``: ``row_index`` (its row in the rows read), ``input_ids``,
        ``prompt_text``, ``data_source``, ``ground_truth``, ``extra_info``, ``ability``."""
        return self._prompts[index].as_dict()

    @property
    def fingerprint(self) -> str:
        """16 hex digits of a sha256 over the kept prompts' token ids and ground truths, in
        order: equal for the same data tokenized the same way."""
        return self._fingerprint

    def batch(
        self,
        indices: Sequence[int],
        *,
        uid_prefix: str,
        pad_token_id: int | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> DataProto:
        """The kept prompts ``indices``, one row each, left-padded to ``max_prompt_length``
        with ``pad_token_id`` (the tokenizer's by default); a prompt's ``uid`` is
        ``<uid_prefix>-<row_index>`` (see :class:`DatasetPrompts` for the columns)."""
        pad = self.pad_token_id if pad_token_id is None else pad_token_id
        if pad is None:
            raise TrainerConfigError(
                "PromptDataset.batch: the tokenizer has neither a pad nor an eos token; "
                "give pad_token_id"
            )
        prompts = [self._prompts[i] for i in indices]
        return prompt_batch(
            prompts,
            uids=[f"{uid_prefix}-{p.row_index}" for p in prompts],
            width=self.max_prompt_length,
            pad_token_id=pad,
            meta_info=meta_info or {},
        )

    # -- building ------------------------------------------------------------------------

    def _where(self, index: int) -> str:
        file, row = self._origins[index]
        return f"{file} row {row}" if row == index else f"{file} row {row} (dataset row {index})"

    def _check_columns(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Every bad row at once: no ``reward_fn_key`` string, no ground truth."""
        key = self.reward_fn_key
        self._raise_bad(
            rows,
            lambda row: not isinstance(row.get(key), str),
            f"no string {key!r} (data.reward_fn_key)",
            lambda row: f"{key}={short(row.get(key), 40)}",
        )
        if self.require_ground_truth:
            self._raise_bad(
                rows,
                lambda row: _ground_truth(row) is None,
                "no reward_model.ground_truth (require_ground_truth=True)",
                lambda row: f"reward_model={short(row.get('reward_model'), 60)}",
            )

    def _raise_bad(
        self,
        rows: Sequence[Mapping[str, Any]],
        bad: Callable[[Mapping[str, Any]], bool],
        what: str,
        value: Callable[[Mapping[str, Any]], str],
    ) -> None:
        found = [i for i, row in enumerate(rows) if bad(row)]
        if not found:
            return
        quoted = "; ".join(f"{self._where(i)}: {value(rows[i])}" for i in found[:_QUOTED])
        more = f"; and {len(found) - _QUOTED} more" if len(found) > _QUOTED else ""
        raise DatasetError(f"{len(found)} of {len(rows)} rows have {what}: {quoted}{more}")

    def _tokenize(
        self, index: int, row: Mapping[str, Any], tokenizer: Any
    ) -> tuple[TokenizedPrompt | None, int]:
        """The kept prompt of row ``index`` and whether it was truncated (``None``: too long
        and filtered out)."""
        where = self._where(index)
        if self.prompt_key not in row:
            raise DatasetError(
                f"{where}: no prompt column {self.prompt_key!r} (data.prompt_key); "
                f"the row has the columns {sorted(row)}"
            )
        text, ids = render_prompt(row[self.prompt_key], tokenizer, where)
        extra_info = row.get("extra_info")
        if extra_info is not None and not isinstance(extra_info, Mapping):
            raise DatasetError(f"{where}: extra_info must be a dict, got {short(extra_info)}")
        ability = row.get("ability")
        if ability is not None and not isinstance(ability, str):
            raise DatasetError(f"{where}: ability must be a string, got {short(ability)}")
        limit, cut = self.max_prompt_length, 0
        if len(ids) > limit:
            if self.filter_overlong_prompts:
                return None, 0
            if self.truncation == "error":
                raise DatasetError(
                    f"{where}: the prompt is {len(ids)} tokens, more than "
                    f"max_prompt_length={limit} (truncation='error'; set data.truncation to "
                    f"'left' or 'right', or filter_overlong_prompts): {short(text)}"
                )
            ids = ids[-limit:] if self.truncation == "left" else ids[:limit]
            cut = 1
        prompt = TokenizedPrompt(
            row_index=index,
            input_ids=tuple(ids),
            prompt_text=text,
            data_source=str(row[self.reward_fn_key]),
            ground_truth=_ground_truth(row),
            extra_info=dict(extra_info) if extra_info is not None else None,
            ability=ability,
        )
        return prompt, cut


def _ground_truth(row: Mapping[str, Any]) -> Any:
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, Mapping):
        return None
    return reward_model.get("ground_truth")


def _fingerprint(prompts: Sequence[TokenizedPrompt]) -> str:
    digest = hashlib.sha256()
    for prompt in prompts:
        record = [list(prompt.input_ids), prompt.ground_truth]
        digest.update(json.dumps(record, sort_keys=True, default=repr).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()[:16]
