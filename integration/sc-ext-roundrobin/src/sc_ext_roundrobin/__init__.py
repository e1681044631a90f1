"""sc-ext-roundrobin: an extension of sc written against its public API only.

It adds a dispatch mode, :data:`ROUND_ROBIN` (registered with sc-dispatch on import), and a
worker, :class:`WordCounter`, that uses it. It depends on sc-dispatch and sc-core alone,
runs on any worker group (``LocalWorkerGroup`` in its tests), and its calls are typed:
``wg.count_words(texts)`` is a ``list[int]`` for mypy with ``sc_core.mypy_plugin``, and so
is ``wg.call(WordCounter.count_words, texts)`` for any type checker.
"""

from ._mode import ROUND_ROBIN, collect_round_robin, deal, dispatch_round_robin, undeal
from ._worker import WordCounter

__version__ = "0.0.0"

__all__ = [
    "ROUND_ROBIN",
    "WordCounter",
    "__version__",
    "collect_round_robin",
    "deal",
    "dispatch_round_robin",
    "undeal",
]
