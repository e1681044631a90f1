"""A checkpoint scored alone on a validation file: avg@k and pass@k (``sc-eval``).

:func:`evaluate` samples ``k`` responses per prompt with sc-workers' built-in engine in this
process, scores them with the run's reward function, and reports :class:`EvaluationResult`
(overall and per ``data_source``), every sample written beside it.
"""

from sc_dispatch import _public

from ._evaluate import EvaluationResult, evaluate

__all__ = ["EvaluationResult", "evaluate"]

_public.publish(globals())
