"""Value equality with NaN equal to NaN: tensors, numpy arrays, and anything else."""

from __future__ import annotations

import math
from collections.abc import Iterator
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
    return _equal(a, b, set())


def _arrays_equal(a: NDArray, b: NDArray) -> bool:
    return _equal(a, b, set())


#: The pairs of objects (by id) whose comparison is under way on the current path.
_Path = set[tuple[int, int]]


def _equal(a: Any, b: Any, path: _Path) -> bool:
    """Deep equality, NaN equal to NaN. Object arrays, lists, tuples and dicts are compared
    element by element; a pair of containers met again while it is being compared (an
    array that holds itself) counts as equal there, so cycles end instead of recursing
    forever, and two arrays that each hold themselves are equal, as in verl."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.shape != b.shape:
            return False
        if a.dtype != object and b.dtype != object:
            equal_nan = a.dtype.kind in "fc" and b.dtype.kind in "fc"
            return bool(np.array_equal(a, b, equal_nan=equal_nan))
        return _each_equal(a, b, zip(a.ravel(), b.ravel(), strict=True), path)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return _tensors_equal(a, b)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is type(b) and isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return False
        return _each_equal(a, b, zip(a, b, strict=True), path)
    if type(a) is type(b) and isinstance(a, dict):
        if a.keys() != b.keys():
            return False
        return _each_equal(a, b, ((a[k], b[k]) for k in a), path)
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _each_equal(a: Any, b: Any, pairs: Iterator[tuple[Any, Any]], path: _Path) -> bool:
    pair = (id(a), id(b))
    if pair in path:
        return True  # a cycle: this pair is already being compared further up
    path.add(pair)
    try:
        return all(_equal(x, y, path) for x, y in pairs)
    finally:
        path.discard(pair)
