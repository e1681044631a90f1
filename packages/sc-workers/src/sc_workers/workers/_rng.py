"""The process's RNG states (torch, CUDA, Python, NumPy) as checkpoint values: tensors and
plain values only, so that they load with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng", "restore_rng"]


def capture_rng(device: torch.device) -> dict[str, Any]:
    """The RNG states, as tensors and plain values (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [
            str(kind),
            torch.from_numpy(np.asarray(keys).copy()),
            int(pos),
            int(has_gauss),
            float(cached),
        ],
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _as_tuple(value: Any) -> Any:
    """``random.getstate()``'s nested tuples, back from a round trip as lists or tuples."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuple(v) for v in value)
    return value
