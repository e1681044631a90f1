"""The engine's weights as named tensors: what the model holds (:class:`WeightSpec`),
reading them from a safetensors file or a Hugging Face directory, checking them against the
model before anything changes, copying them in, and freeing and restoring the model's
storage (sleep and wake up).

Names are those of the transformers model's state dict, which is what ``save_pretrained``
writes (``transformer.h.0.attn.c_attn.weight``, not sc-workers' ``model.…``). Tensors that
the model ties together (input and output embeddings) appear under several names; a file
needs only one of them, as ``save_pretrained`` writes it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sc_rollout.errors import WeightLoadError, WeightMismatchError
from torch import Tensor, nn

from .._errors import OptionalDependencyError

__all__ = [
    "WeightSpec",
    "copy_into",
    "free",
    "read_weights",
    "restore",
    "snapshot",
    "weight_files",
]

#: how many names an error lists before it only counts the rest
_FEW = 5


def _few(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_FEW])
    more = len(names) - _FEW
    return f"{shown}, and {more} more" if more > 0 else shown


def _safetensors(where: str) -> Any:
    """``safetensors.torch`` (installed with the ``hf`` extra)."""
    try:
        return importlib.import_module("safetensors.torch")
    except ImportError as exc:
        raise OptionalDependencyError(f"{where} needs safetensors: install sc-workers[hf]") from exc


def weight_files(path: str, where: str) -> list[Path]:
    """The safetensors files at ``path``: the file itself, or a directory's ``*.safetensors``
    (sorted); :class:`WeightLoadError` if there are none."""
    location = Path(path)
    if location.is_dir():
        files = sorted(p for p in location.glob("*.safetensors") if p.is_file())
        if not files:
            raise WeightLoadError(f"{where}: the directory {path!r} holds no *.safetensors file")
        return files
    if location.is_file():
        return [location]
    raise WeightLoadError(f"{where}: no file or directory at {path!r}")


def read_weights(path: str, where: str) -> dict[str, Tensor]:
    """Every tensor at ``path`` (a safetensors file, or a directory of them), on the CPU.

    Unreadable files and a name held by two files of one directory are a
    :class:`WeightLoadError` naming ``where`` and the file."""
    module = _safetensors(where)
    error: type[Exception] = importlib.import_module("safetensors").SafetensorError
    tensors: dict[str, Tensor] = {}
    for file in weight_files(path, where):
        try:
            part: dict[str, Tensor] = module.load_file(str(file), device="cpu")
        except OSError as exc:
            raise WeightLoadError(f"{where}: cannot read {str(file)!r}: {exc}") from exc
        except error as exc:
            raise WeightLoadError(
                f"{where}: {str(file)!r} is not a safetensors file: {exc}"
            ) from exc
        twice = sorted(set(part) & set(tensors))
        if twice:
            raise WeightLoadError(
                f"{where}: {len(twice)} tensor(s) of {str(file)!r} are also in another file "
                f"of {path!r}: {_few(twice)}"
            )
        tensors.update(part)
    return tensors


@dataclass(frozen=True)
class WeightSpec:
    """The tensors of a model: each state-dict name's shape and dtype, and the names that
    share one tensor (``groups``; one name each, but for tied weights)."""

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    groups: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, module: nn.Module) -> WeightSpec:
        state = module.state_dict(keep_vars=True)
        by_tensor: dict[int, list[str]] = {}
        for name, tensor in state.items():
            by_tensor.setdefault(id(tensor), []).append(name)
        return cls(
            shapes={name: tuple(t.shape) for name, t in state.items()},
            dtypes={name: t.dtype for name, t in state.items()},
            groups=tuple(tuple(names) for names in by_tensor.values()),
        )

    def check(self, tensors: Mapping[str, Tensor], where: str) -> None:
        """Raise a :class:`WeightMismatchError` listing every name of ``tensors`` the model does
        not hold, every tensor of the model none of them gives, and every shape that differs
        (the first few of each, and how many)."""
        problems: list[str] = []
        unexpected = sorted(name for name in tensors if name not in self.shapes)
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected name(s): {_few(unexpected)}")
        missing = [g[0] for g in self.groups if not any(name in tensors for name in g)]
        if missing:
            problems.append(f"{len(missing)} missing name(s): {_few(missing)}")
        wrong = [
            f"{name} {tuple(t.shape)} (the model's {self.shapes[name]})"
            for name, t in sorted(tensors.items())
            if name in self.shapes and tuple(t.shape) != self.shapes[name]
        ]
        if wrong:
            problems.append(f"{len(wrong)} shape mismatch(es): {_few(wrong)}")
        if problems:
            raise WeightMismatchError(
                f"{where}: the weights do not fit the model: " + "; ".join(problems)
            )

    def canonical(self, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """One tensor per group, under the group's first name (``tensors`` passed
        :meth:`check`)."""
        out: dict[str, Tensor] = {}
        for group in self.groups:
            out[group[0]] = next(tensors[name] for name in group if name in tensors)
        return out


@torch.no_grad()
def copy_into(module: nn.Module, spec: WeightSpec, tensors: Mapping[str, Tensor]) -> None:
    """Copy checked ``tensors`` into ``module``'s own (cast to their dtype and device)."""
    state = module.state_dict(keep_vars=True)
    for name, value in spec.canonical(tensors).items():
        state[name].copy_(value)


@torch.no_grad()
def snapshot(module: nn.Module, spec: WeightSpec) -> dict[str, Tensor]:
    """A CPU copy of ``module``'s tensors, one per group."""
    state = module.state_dict(keep_vars=True)
    return {g[0]: state[g[0]].detach().to("cpu", copy=True) for g in spec.groups}


def free(module: nn.Module, spec: WeightSpec) -> None:
    """Drop the storage of ``module``'s tensors (each becomes an empty tensor of its dtype
    on its device); :func:`restore` gives it back."""
    state = module.state_dict(keep_vars=True)
    for group in spec.groups:
        tensor = state[group[0]]
        tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)


@torch.no_grad()
def restore(module: nn.Module, spec: WeightSpec, tensors: Mapping[str, Tensor]) -> None:
    """Give ``module``'s tensors their storage back, filled from checked ``tensors``."""
    state = module.state_dict(keep_vars=True)
    for name, value in spec.canonical(tensors).items():
        tensor = state[name]
        fresh = torch.empty(spec.shapes[name], dtype=spec.dtypes[name], device=tensor.device)
        fresh.copy_(value)
        tensor.data = fresh
