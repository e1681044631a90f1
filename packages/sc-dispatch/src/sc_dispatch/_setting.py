"""Typed declarations of environment variables, shared by every sc package.

Private: this module is shared by the sc distributions only (each declares its variables
with it, importing ``sc_dispatch._setting``); it is not public API, and code outside sc does
not import it. A package lists its declarations in its public ``SETTINGS`` tuple, from which the
documentation's table of environment variables is generated (sc-dispatch reads none).

Each package declares every variable it reads once, in its private ``_settings.py``, as a
:class:`Setting`: the name, one parser from this module, the default, a line of
documentation and the former names it still accepts. Code then reads a value with
``SETTING.get()`` (the process environment) or ``SETTING.get(env)`` (a worker's own
environment mapping, as the in-process backend gives each rank), so there is one grammar per
type and one place that knows each variable's spelling.

Names follow ``SC_<PACKAGE>_<NAME>``; durations are seconds and end in ``_S``. A value that
is empty or only whitespace counts as unset. A value that does not parse raises
:class:`SettingValueError` (a ``ValueError``) naming the variable and the value. A variable read
through a deprecated name works and logs one warning per name and process.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from ._errors import SettingDeclarationError, SettingValueError

__all__ = [
    "Setting",
    "SettingDeclarationError",
    "SettingValueError",
    "parse_bool",
    "parse_int",
    "parse_path",
    "parse_seconds",
    "parse_str",
]

T_co = TypeVar("T_co", covariant=True)

_log = logging.getLogger("sc_dispatch.settings")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_NAME = re.compile(r"SC_[A-Z][A-Z0-9]*(_[A-Z0-9]+)*")


def parse_bool(raw: str) -> bool:
    """``1/true/yes/on`` → ``True``, ``0/false/no/off`` → ``False`` (any case, no other word)."""
    word = raw.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")


def parse_seconds(raw: str) -> float:
    """A finite number of seconds greater than 0 (``"0.5"``, ``"300"``)."""
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError("expected a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("expected a finite number of seconds greater than 0")
    return value


def parse_int(raw: str) -> int:
    """A whole number in decimal (``"8"``, ``"-1"``)."""
    try:
        return int(raw.strip(), 10)
    except ValueError:
        raise ValueError("expected a whole number") from None


def parse_str(raw: str) -> str:
    """The value without surrounding whitespace."""
    return raw.strip()


def parse_path(raw: str) -> Path:
    """A filesystem path; ``~`` expands to the home directory."""
    return Path(raw.strip()).expanduser()


_TYPE_NAMES: dict[Callable[[str], object], str] = {
    parse_bool: "bool",
    parse_seconds: "seconds",
    parse_int: "int",
    parse_str: "str",
    parse_path: "path",
}

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(alias: str, name: str) -> None:
    with _warned_lock:
        if alias in _warned:
            return
        _warned.add(alias)
    _log.warning("environment variable %s is deprecated: set %s instead", alias, name)


@dataclass(frozen=True)
class Setting(Generic[T_co]):
    """One environment variable: its name, parser, default, documentation and former names.

    ``parse`` is one of :func:`parse_bool`, :func:`parse_seconds`, :func:`parse_int`,
    :func:`parse_str`, :func:`parse_path` (or another function that raises ``ValueError`` on
    a bad value); ``default`` is what :meth:`get` returns when the variable is unset.
    ``deprecated`` lists former names, read when ``name`` is unset.
    """

    name: str
    parse: Callable[[str], T_co]
    default: T_co
    doc: str
    deprecated: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.deprecated, tuple):
            raise SettingDeclarationError(
                f"Setting {self.name!r}: deprecated must be a tuple of names, "
                f"got {type(self.deprecated).__name__}"
            )
        for label, value in (("name", self.name), *(("deprecated", a) for a in self.deprecated)):
            if not isinstance(value, str) or _NAME.fullmatch(value) is None:
                raise SettingDeclarationError(
                    f"Setting {label} must be an upper-case SC_* name, got {value!r}"
                )
        if self.name in self.deprecated or len(set(self.deprecated)) != len(self.deprecated):
            raise SettingDeclarationError(
                f"Setting {self.name}: deprecated names {self.deprecated!r} repeat a name"
            )
        if not callable(self.parse):
            raise SettingDeclarationError(f"Setting {self.name}: parse must be callable")
        if self.parse is parse_seconds and not self.name.endswith("_S"):
            raise SettingDeclarationError(
                f"Setting {self.name}: a duration in seconds must be named ..._S"
            )
        if not isinstance(self.doc, str) or not self.doc.strip():
            raise SettingDeclarationError(f"Setting {self.name}: doc must be a non-empty string")

    @property
    def type_name(self) -> str:
        """``bool``, ``seconds``, ``int``, ``str``, ``path``, or the custom parser's name."""
        known = _TYPE_NAMES.get(self.parse)
        if known is not None:
            return known
        name = getattr(self.parse, "__name__", type(self.parse).__name__)
        return name.removeprefix("parse_")

    @property
    def names(self) -> tuple[str, ...]:
        """The name, then every deprecated name."""
        return (self.name, *self.deprecated)

    def raw(self, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
        """``(variable, value)`` as found in ``env`` (default ``os.environ``), or ``None``.

        The current name wins over the deprecated ones; empty values count as unset.
        """
        source: Mapping[str, str] = os.environ if env is None else env
        for variable in self.names:
            value = source.get(variable)
            if value is not None and value.strip():
                if variable != self.name:
                    _warn_once(variable, self.name)
                return variable, value
        return None

    def get(self, env: Mapping[str, str] | None = None) -> T_co:
        """The parsed value from ``env`` (default ``os.environ``), or ``default`` when unset.

        Raises :class:`SettingValueError` (a ``ValueError``) naming the variable and its value when
        the value does not parse.
        """
        found = self.raw(env)
        if found is None:
            return self.default
        variable, value = found
        try:
            return self.parse(value)
        except ValueError as exc:
            via = "" if variable == self.name else f" (deprecated name of {self.name})"
            raise SettingValueError(
                f"environment variable {variable}={value!r}{via} is not a valid "
                f"{self.type_name}: {exc}"
            ) from None
