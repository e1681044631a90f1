"""The digit task as text, for a Hugging Face model and its own tokenizer (``sc-demo --model``).

The prompt is the text ``"3805="`` (after the tokenizer's bos token, if it has one), the right
answer the text ``"5083"`` followed by an end-of-sequence token. Tokens need not be digits:
a tokenizer may merge several digits into one token, so the response is decoded to text and
scored character by character, and the score (the fraction of the answer's characters that
are right) is paid on the response's last token, as an outcome reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._errors import TaskError
from ..config import TaskConfig
from ..data._batch import left_padded
from ._digits import DigitsTask

__all__ = ["TextDigitsTask"]


class TextDigitsTask(DigitsTask):
    """:class:`DigitsTask` through a Hugging Face tokenizer (same split, same targets)."""

    def __init__(self, config: TaskConfig | None, tokenizer: Any) -> None:
        super().__init__(config)
        for name in ("pad_token_id", "eos_token_id"):
            if not isinstance(getattr(tokenizer, name, None), int):
                raise TaskError(
                    f"TextDigitsTask: the tokenizer has no {name} (got "
                    f"{getattr(tokenizer, name, None)!r}); the task pads prompts and ends "
                    "answers with it"
                )
        self.hf_tokenizer = tokenizer
        every = [*self.train_strings, *self.val_strings]
        prompts = self._token_ids([f"{s}=" for s in every])
        answers = self._token_ids([self.target(str(s)) for s in every])
        bos = getattr(tokenizer, "bos_token_id", None)
        self._bos: list[int] = [bos] if isinstance(bos, int) else []
        self._prompt_length = len(self._bos) + max(len(ids) for ids in prompts)
        self._response_length = max(len(ids) for ids in answers) + 1  # and an eos

    def _token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        encoded = self.hf_tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [list(ids) for ids in encoded]

    @property
    def prompt_length(self) -> int:
        """Tokens of the longest prompt (shorter ones are left-padded to it)."""
        return self._prompt_length

    @property
    def response_length(self) -> int:
        """Tokens of the longest answer, and one for the end-of-sequence token."""
        return self._response_length

    def encode_prompts(self, texts: Sequence[str] | np.ndarray) -> dict[str, torch.Tensor]:
        """Left-padded ``input_ids``, ``attention_mask`` and ``position_ids``, ``[B, P]``."""
        self._check_prompts(texts, "TextDigitsTask.encode_prompts")
        rows = [self._bos + ids for ids in self._token_ids([f"{t}=" for t in texts])]
        return left_padded(rows, self.prompt_length, int(self.hf_tokenizer.pad_token_id))

    def token_scores(
        self,
        texts: Sequence[str] | np.ndarray,
        responses: torch.Tensor,
        response_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-token reward ``[B, R]``: each row's score on its last generated token.

        The score is the fraction of the answer's characters that the decoded response
        (special tokens and whitespace dropped) has right, position by position.
        """
        self._check_responses(texts, responses, response_mask, "TextDigitsTask.token_scores")
        mask = torch.ones_like(responses) if response_mask is None else response_mask
        out = torch.zeros(responses.shape, dtype=torch.float32)
        lengths = mask.cpu().long().sum(dim=1)
        length = self.config.length
        for row, text in enumerate(texts):
            n = int(lengths[row])
            if n == 0:
                continue
            ids = responses[row, :n].cpu().tolist()
            # a word-level tokenizer decodes with spaces between tokens: digits never hold one
            answer = "".join(self.hf_tokenizer.decode(ids, skip_special_tokens=True).split())
            target = self.target(str(text))
            right = sum(a == b for a, b in zip(answer, target, strict=False))
            out[row, n - 1] = right / length
        return out
