"""``TorchRolloutEngineConfig``: the settings of the built-in rollout engine, validated on
construction (each bad value is a :class:`~sc_workers.ConfigError` naming the field)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .._errors import ConfigError

__all__ = ["DTYPES", "TorchRolloutEngineConfig"]

#: the parameter dtypes the engine runs in (the log-probs a trainer recomputes are float32)
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32}


def _check_int(owner: str, name: str, value: object, minimum: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{owner}.{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{owner}.{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class TorchRolloutEngineConfig:
    """The built-in rollout engine's settings.

    * ``model``: a local Hugging Face causal-LM directory (what ``save_pretrained`` writes;
      a path-like is stored as ``str``). Read when the engine is built, not here.
    * ``device``: where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``...).
    * ``dtype``: the parameters' dtype; ``"float32"`` only in this release.
    * ``seed``: seeds torch while the model is built (whatever the checkpoint does not
      hold). Sampling is seeded per request (``SamplingParams.seed``; ``None``: random).
    * ``max_batch_size``: requests decoded together in one step (>= 1); the others wait
      and join as soon as a slot frees.
    * ``step_delay_s``: seconds of waiting before each decoding step (0: none), which makes
      a slow server on demand (tests of routers and weight updates during a request).
    * ``name``: the model name :meth:`~sc_workers.rollout.TorchRolloutEngine.health`
      reports (``None``: the directory's name).
    * ``exact_window``: > 0 turns on the exact mode: each decoding step runs each request
      alone, left-aligned in a row of this many tokens, as an actor with the same
      ``rollout.exact_window`` recomputes it, so the reported log-probs equal the actor's bit
      for bit (slower: no batching). At least the prompt plus the response; 0: off.
    """

    model: str
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    max_batch_size: int = 8
    step_delay_s: float = 0.0
    name: str | None = None
    exact_window: int = 0

    def __post_init__(self) -> None:
        owner = "TorchRolloutEngineConfig"
        model: object = self.model
        if isinstance(model, os.PathLike):
            model = os.fspath(model)
        if not isinstance(model, str) or not model:
            raise ConfigError(f"{owner}.model must be a non-empty path, got {self.model!r}")
        object.__setattr__(self, "model", model)
        if not isinstance(self.device, str):
            raise ConfigError(f"{owner}.device must be a str, got {self.device!r}")
        try:
            torch.device(self.device)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"{owner}.device must name a torch device (cpu, cuda, cuda:1), got {self.device!r}"
            ) from exc
        if self.dtype not in DTYPES:
            raise ConfigError(f"{owner}.dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        _check_int(owner, "seed", self.seed, None)
        _check_int(owner, "max_batch_size", self.max_batch_size, 1)
        _check_int(owner, "exact_window", self.exact_window, 0)
        delay: object = self.step_delay_s
        if isinstance(delay, bool) or not isinstance(delay, (int, float)):
            raise ConfigError(f"{owner}.step_delay_s must be a number, got {delay!r}")
        if not math.isfinite(delay) or delay < 0:
            raise ConfigError(f"{owner}.step_delay_s must be a finite number >= 0, got {delay!r}")
        object.__setattr__(self, "step_delay_s", float(delay))
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ConfigError(f"{owner}.name must be a non-empty str or None, got {self.name!r}")

    @property
    def model_name(self) -> str:
        """The name the engine reports: ``name``, or the model directory's name."""
        return self.name or Path(self.model).resolve().name or self.model

    @property
    def torch_dtype(self) -> torch.dtype:
        """``dtype`` as a ``torch.dtype``."""
        return DTYPES[self.dtype]
