"""``WordCounter``: a worker whose methods are dealt round-robin."""

from __future__ import annotations

from sc_core import Worker
from sc_dispatch import Dispatch, register

from ._mode import ROUND_ROBIN

__all__ = ["WordCounter"]


class WordCounter(Worker):
    """Counts words; every rank handles the texts dealt to it and remembers how many.

    ``lowercase`` folds case before :meth:`distinct_words` compares words.
    """

    def __init__(self, lowercase: bool = True) -> None:
        super().__init__()
        self.lowercase = lowercase
        self.handled = 0

    @register(dispatch_mode=ROUND_ROBIN)
    def count_words(self, texts: list[str]) -> list[int]:
        """The number of whitespace-separated words of each text."""
        self.handled += len(texts)
        return [len(t.split()) for t in texts]

    @register(dispatch_mode=ROUND_ROBIN)
    def distinct_words(self, texts: list[str], min_length: int = 1) -> list[set[str]]:
        """The distinct words of each text that have at least ``min_length`` characters."""
        self.handled += len(texts)
        fold = str.lower if self.lowercase else str
        return [{fold(w) for w in t.split() if len(w) >= min_length} for t in texts]

    @register(dispatch_mode=ROUND_ROBIN)
    def owner(self, texts: list[str]) -> list[int]:
        """For each text, the rank that handled it."""
        return [self.rank] * len(texts)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def handled_count(self) -> int:
        """How many texts this rank has handled so far."""
        return self.handled
