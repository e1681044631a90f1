"""Which metric values a tracker records, and a run's configuration as plain data."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["STEP_KEY", "plain", "scalar_metrics"]

#: The key of a record that holds its step: the x axis of every tracker, passed to ``log`` as
#: ``step``, never recorded as a metric of its own.
STEP_KEY = "step"


def _number(value: Any) -> float | int | None:
    """``value`` as an ``int`` or a finite ``float``, or ``None`` when it is no number."""
    if value is None or isinstance(value, (str, bytes)):
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    item = getattr(value, "item", None)  # a 0-d torch tensor or numpy array
    if callable(item) and getattr(value, "ndim", None) == 0:
        return _number(item())
    return None


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float | int]:
    """The numbers of a step's record, by metric name.

    Kept: ``int`` and ``float`` (numpy scalars and 0-d arrays or tensors too); ``bool`` as
    ``0``/``1``. Skipped: ``None``, non-finite floats (``metrics.jsonl`` writes them as
    ``null``), strings, lists and anything else, and the ``"step"`` key (:data:`STEP_KEY`).
    """
    found: dict[str, float | int] = {}
    for key, value in metrics.items():
        if key == STEP_KEY:
            continue
        number = _number(value)
        if number is not None:
            found[str(key)] = number
    return found


def plain(value: Any) -> Any:
    """``value`` as JSON-like data (dicts with string keys, lists, str, int, float, bool,
    None); anything else (a path, an enum, a dataclass) as its ``str``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain(v) for v in value), key=repr)
    return str(value)
