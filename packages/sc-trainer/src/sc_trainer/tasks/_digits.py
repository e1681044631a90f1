"""The toy task: answer a string of digits reversed (or copied), scored per position.

A prompt is ``<bos> d1 d2 ... dL =`` and the right response is ``dL ... d2 d1``. The reward of a
response is the fraction of the L positions it gets right, so a policy that samples uniformly
from the vocabulary scores about ``1 / vocab_size`` (low, but not zero: the gradient has
something to follow) and a policy that has learnt to attend to the mirrored prompt position
scores 1. Every string of L digits is either in the training split or in the held-out
validation split, never both, so the validation reward measures a rule, not a memorised table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sc_protocol import DataProto

from .._errors import TaskError
from .._scores import BatchScores
from ..config import TaskConfig
from ..data._batch import left_padded

__all__ = ["CharTokenizer", "DigitsTask", "sample_distinct"]


def sample_distinct(strings: np.ndarray, n: int, seed: int, step: int, where: str) -> np.ndarray:
    """``n`` distinct entries of ``strings``, a function of ``(seed, step)`` only (a
    :class:`TaskError` from ``where`` unless ``1 <= n <= len(strings)``)."""
    if not 1 <= n <= len(strings):
        raise TaskError(f"{where}: n must be in 1..{len(strings)}, got {n}")
    rng = np.random.default_rng([seed, step])
    picked: np.ndarray = strings[rng.choice(len(strings), n, False)]
    return picked


class CharTokenizer:
    """A character-level tokenizer with three special tokens, built in code.

    Ids: ``pad = 0``, ``bos = 1``, ``eos = 2``, then one id per character of ``alphabet``.
    """

    PAD = "<pad>"
    BOS = "<bos>"
    EOS = "<eos>"

    def __init__(self, alphabet: str) -> None:
        if not alphabet or len(set(alphabet)) != len(alphabet):
            raise TaskError(
                f"CharTokenizer: the alphabet must be non-empty with distinct characters, "
                f"got {alphabet!r}"
            )
        self._tokens = [self.PAD, self.BOS, self.EOS, *alphabet]
        self._ids = {tok: i for i, tok in enumerate(self._tokens)}

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def pad_token_id(self) -> int:
        return 0

    @property
    def bos_token_id(self) -> int:
        return 1

    @property
    def eos_token_id(self) -> int:
        return 2

    def encode(self, text: str) -> list[int]:
        """The ids of the characters of ``text`` (no special tokens added)."""
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as err:
            raise TaskError(
                f"CharTokenizer.encode: character {err.args[0]!r} of {text!r} is not in the "
                f"vocabulary {''.join(self._tokens[3:])!r}"
            ) from None

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """The text of ``ids``; special tokens are dropped unless ``skip_special`` is false."""
        out = []
        for i in ids:
            if not 0 <= i < len(self._tokens):
                raise TaskError(
                    f"CharTokenizer.decode: id {i} is outside the vocabulary "
                    f"(size {len(self._tokens)})"
                )
            if skip_special and i < 3:
                continue
            out.append(self._tokens[i])
        return "".join(out)


class DigitsTask:
    """Prompts, targets and the verifiable reward of the digit-reversal task."""

    def __init__(self, config: TaskConfig | None = None) -> None:
        self.config = config if config is not None else TaskConfig()
        self.tokenizer = CharTokenizer("0123456789=")
        length = self.config.length
        everything = np.array([str(i).zfill(length) for i in range(10**length)], dtype=object)
        order = np.random.default_rng(self.config.split_seed).permutation(len(everything))
        self.val_strings: np.ndarray = everything[np.sort(order[: self.config.num_val])]
        self.train_strings: np.ndarray = everything[np.sort(order[self.config.num_val :])]

    @property
    def prompt_length(self) -> int:
        """Tokens per prompt: ``<bos>``, the digits and ``=``."""
        return self.config.length + 2

    @property
    def response_length(self) -> int:
        """Tokens the policy generates per prompt."""
        return self.config.length

    def target(self, text: str) -> str:
        """The right response to the prompt made of ``text``."""
        return text[::-1] if self.config.mode == "reverse" else text

    def sample_train(self, n: int, seed: int, step: int) -> np.ndarray:
        """``n`` distinct training strings, a function of ``(seed, step)`` only.

        Drawing from a generator seeded by the step (instead of one long-lived generator)
        makes a resumed run draw exactly what the uninterrupted run drew.
        """
        return sample_distinct(self.train_strings, n, seed, step, "DigitsTask.sample_train")

    def _check_prompts(self, texts: Sequence[str] | np.ndarray, where: str) -> None:
        """At least one prompt, each a string of ``config.length`` digits."""
        if len(texts) == 0:
            raise TaskError(f"{where}: got no prompts")
        for text in texts:
            if len(text) != self.config.length or not str(text).isdigit():
                raise TaskError(f"{where}: prompt {text!r} is not {self.config.length} digits")

    @staticmethod
    def _check_responses(
        texts: Sequence[str] | np.ndarray,
        responses: torch.Tensor,
        response_mask: torch.Tensor | None,
        where: str,
    ) -> None:
        """One row of responses per prompt, and a mask of the same shape (if any)."""
        if responses.dim() != 2 or responses.shape[0] != len(texts):
            raise TaskError(
                f"{where}: expected responses of shape [{len(texts)}, R], got "
                f"{list(responses.shape)}"
            )
        if response_mask is not None and response_mask.shape != responses.shape:
            raise TaskError(
                f"{where}: response_mask shape {list(response_mask.shape)} "
                f"differs from responses shape {list(responses.shape)}"
            )

    def encode_prompts(self, texts: Sequence[str] | np.ndarray) -> dict[str, torch.Tensor]:
        """``input_ids``, ``attention_mask`` and ``position_ids`` of the prompts, ``[B, P]``."""
        self._check_prompts(texts, "DigitsTask.encode_prompts")
        rows = [[self.tokenizer.bos_token_id, *self.tokenizer.encode(f"{text}=")] for text in texts]
        return left_padded(rows, self.prompt_length, pad_token_id=0)  # all one length

    def token_scores(
        self,
        texts: Sequence[str] | np.ndarray,
        responses: torch.Tensor,
        response_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-token reward ``[B, R]``: ``1 / L`` on each response position that is right.

        A position counts only where ``response_mask`` is 1 (a response that stopped early
        gets no credit for the positions it never produced); tokens past the target earn
        nothing. The row sums are :meth:`score`. Giving each token its own credit (instead of
        the whole score on the last token) tells the critic which position was wrong.
        """
        where = "DigitsTask.token_scores"
        self._check_responses(texts, responses, response_mask, where)
        length = self.config.length
        if responses.shape[1] < length:
            raise TaskError(
                f"{where}: responses have {responses.shape[1]} tokens, the task needs {length}"
            )
        targets = torch.tensor(
            [self.tokenizer.encode(self.target(str(t))) for t in texts], dtype=torch.long
        )
        hits = responses[:, :length].cpu() == targets
        if response_mask is not None:
            hits &= response_mask[:, :length].cpu().bool()
        out = torch.zeros(responses.shape, dtype=torch.float32)
        out[:, :length] = hits.float() / length
        return out

    def score(
        self,
        texts: Sequence[str] | np.ndarray,
        responses: torch.Tensor,
        response_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-prompt reward in ``[0, 1]``: the fraction of target positions right."""
        return self.token_scores(texts, responses, response_mask).sum(dim=1)

    def score_batch(self, batch: DataProto) -> BatchScores:
        """The per-token reward ``[rows, R]`` of a generated batch: :meth:`token_scores` of
        its ``prompt_text`` column, ``responses`` and ``response_mask`` (no metrics)."""
        td: Any = batch.batch
        missing = [k for k in ("responses", "response_mask") if td is None or k not in td]
        if missing or "prompt_text" not in batch.non_tensor_batch:
            raise TaskError(
                f"{type(self).__name__}.score_batch: the batch lacks "
                f"{missing or ['prompt_text']} (a rollout's output holds them)"
            )
        texts = batch.non_tensor_batch["prompt_text"]
        return BatchScores(self.token_scores(texts, td["responses"], td["response_mask"]), {})
