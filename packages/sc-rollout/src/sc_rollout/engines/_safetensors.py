"""The tensor names and shapes of safetensors files, read from their headers (stdlib only):
how an engine checks a weight push against its model before it loads anything."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from .._errors import WeightLoadError, WeightMismatchError

__all__ = ["check_same_tensors", "read_shapes", "weight_files"]

#: a header larger than this is not a safetensors header (the format caps it at 100 MB)
_MAX_HEADER = 100 * 1024 * 1024


def weight_files(path: str | Path, where: str) -> list[Path]:
    """The ``*.safetensors`` files of a weight push: the file itself, or every one in the
    folder. A path that does not exist, or a folder without any, is a
    :class:`WeightLoadError`."""
    target = Path(path)
    if target.is_file():
        return [target]
    if target.is_dir():
        files = sorted(target.glob("*.safetensors"))
        if files:
            return files
        raise WeightLoadError(f"{where}: {str(target)!r} holds no *.safetensors file")
    raise WeightLoadError(f"{where}: no file or folder at {str(target)!r}")


def read_shapes(path: str | Path, where: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every tensor in the safetensors file(s) at ``path``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in weight_files(path, where):
        try:
            with open(file, "rb") as handle:
                head = handle.read(8)
                if len(head) != 8:
                    raise WeightLoadError(f"{where}: {str(file)!r} is not a safetensors file")
                (size,) = struct.unpack("<Q", head)
                if size > _MAX_HEADER:
                    raise WeightLoadError(
                        f"{where}: {str(file)!r} is not a safetensors file (header of {size} B)"
                    )
                header = json.loads(handle.read(size))
        except OSError as exc:
            if isinstance(exc, WeightLoadError):
                raise
            raise WeightLoadError(f"{where}: cannot read {str(file)!r}: {exc}") from None
        except ValueError:
            raise WeightLoadError(
                f"{where}: {str(file)!r} is not a safetensors file (bad header)"
            ) from None
        if not isinstance(header, dict):
            raise WeightLoadError(f"{where}: {str(file)!r} is not a safetensors file")
        for name, info in header.items():
            if name == "__metadata__":
                continue
            shape = info.get("shape") if isinstance(info, dict) else None
            if not isinstance(shape, list):
                raise WeightLoadError(f"{where}: {str(file)!r}: tensor {name!r} has no shape")
            shapes[name] = tuple(int(d) for d in shape)
    return shapes


def check_same_tensors(
    expected: dict[str, tuple[int, ...]], pushed: dict[str, tuple[int, ...]], where: str
) -> None:
    """A :class:`WeightMismatchError` unless ``pushed`` holds exactly ``expected``'s tensor
    names with the same shapes; the message lists what differs (the first five of each
    kind, and how many)."""
    missing = sorted(set(expected) - set(pushed))
    unexpected = sorted(set(pushed) - set(expected))
    reshaped = sorted(
        f"{name} {list(pushed[name])} (model: {list(expected[name])})"
        for name in set(expected) & set(pushed)
        if expected[name] != pushed[name]
    )
    problems = []
    for label, names in (
        ("missing", missing),
        ("unexpected", unexpected),
        ("wrong shape", reshaped),
    ):
        if names:
            shown = ", ".join(names[:5]) + (
                f", ... ({len(names)} in all)" if len(names) > 5 else ""
            )
            problems.append(f"{label}: {shown}")
    if problems:
        raise WeightMismatchError(
            f"{where}: the pushed weights do not match the model's {len(expected)} tensors "
            f"({'; '.join(problems)}); nothing was loaded"
        )
