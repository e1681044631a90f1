"""What every configuration dataclass shares: building from a (nested) mapping such as a
verl YAML section, converting back to a dict, and the validators the ``__post_init__``
methods use (each raises :class:`~sc_workers.ConfigError` naming the field and the value)."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin

from .._errors import ConfigError

__all__ = [
    "DTYPES",
    "KL_TYPES",
    "LOSS_AGG_MODES",
    "STRATEGIES",
    "ConfigBase",
    "non_negative",
    "one_of",
    "positive",
]

C = TypeVar("C", bound="ConfigBase")

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
DTYPES = ("float32", "bfloat16", "float16")
STRATEGIES = ("fsdp", "fsdp2", "megatron")


def positive(owner: str, **values: int | float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{owner}.{name} must be a positive number, got {value!r}")


def non_negative(owner: str, **values: int | float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"{owner}.{name} must be >= 0, got {value!r}")


def one_of(owner: str, name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{owner}.{name} must be one of {list(allowed)}, got {value!r}")


def _dataclass_type(hint: Any) -> type[ConfigBase] | None:
    """The ConfigBase subclass inside ``hint`` (``X`` or ``X | None``), if any."""
    candidates = [hint]
    if get_origin(hint) in (Union, types.UnionType):
        candidates = [a for a in get_args(hint) if a is not type(None)]
    for cand in candidates:
        if isinstance(cand, type) and issubclass(cand, ConfigBase):
            return cand
    return None


def _accepts_tuple(hint: Any) -> bool:
    """Whether ``hint`` is a tuple type, or a union with one (a YAML list becomes a tuple)."""
    if get_origin(hint) is tuple:
        return True
    if get_origin(hint) in (Union, types.UnionType):
        return any(get_origin(a) is tuple for a in get_args(hint))
    return False


class ConfigBase:
    """Shared behaviour: build from a (nested) mapping, convert back to a dict."""

    _section: ClassVar[str] = "config"
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        """Build the dataclass from a mapping; nested sections become nested dataclasses.

        Unknown keys raise :class:`ConfigError` naming the key and the section.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{cls._section}: expected a mapping, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"{cls._section}: unknown keys {unknown}; known keys are {sorted(names)}"
            )
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            nested = _dataclass_type(hints[key])
            if nested is not None and isinstance(value, Mapping):
                kwargs[key] = nested.from_dict(value)
            elif isinstance(value, list) and _accepts_tuple(hints[key]):
                kwargs[key] = tuple(value)
            else:
                kwargs[key] = value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """A plain nested dict (``dataclasses.asdict``)."""
        out: dict[str, Any] = dataclasses.asdict(self)
        return out
