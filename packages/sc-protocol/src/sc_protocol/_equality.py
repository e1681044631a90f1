"""Value equality with NaN equal to NaN: tensors, numpy arrays, and anything else."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ._columns import NDArray

__all__ = ["_arrays_equal", "_tensors_equal", "_values_equal"]


def _tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype or a.layout != b.layout:
        return False
    if a.is_nested or b.is_nested:
        if a.is_nested and b.is_nested:
            na: Any = a
            nb: Any = b
            return _tensors_equal(na.values(), nb.values()) and _tensors_equal(
                na.offsets(), nb.offsets()
            )
        return False
    if a.device != b.device:
        b = b.to(a.device)
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a.isnan(), b.isnan())) and bool(
            torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
        )
    return bool(torch.equal(a, b))


def _values_equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        return _arrays_equal(a, b)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return _tensors_equal(a, b)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _arrays_equal(a: NDArray, b: NDArray) -> bool:
    if a is b:
        return True
    if a.shape != b.shape:
        return False
    if a.dtype != object and b.dtype != object:
        equal_nan = a.dtype.kind in "fc" and b.dtype.kind in "fc"
        return bool(np.array_equal(a, b, equal_nan=equal_nan))
    return all(_values_equal(x, y) for x, y in zip(a.ravel(), b.ravel(), strict=True))
