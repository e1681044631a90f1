"""Configuration fields that are also ``sc-demo`` flags, each declared once.

A field declared as ``field(default=..., metadata=option(help=..., group=...))`` carries in
its metadata what the command line needs beyond the field itself: the help text, the help
group, and what differs from the plain spelling (other flag names, a metavar, the default
the help shows, a rule that derives the value from the other options when the flag is not
given). The flag's type, default and
choices are the field's own (a ``Literal`` type gives the choices, a ``bool`` an
``--x/--no-x`` pair). :func:`add_options` makes one flag per such field of a configuration
dataclass, nested configuration dataclasses included (``TrainerConfig.task.length`` is
``--task-length``, read back as ``task_length``); :func:`config_kwargs` turns the parsed
values back into the dataclass's constructor arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

from .._errors import TrainerConfigError

__all__ = ["GROUPS", "Option", "add_options", "config_kwargs", "option"]

#: The help groups of the flags, in the order ``--help`` lists them.
GROUPS = ("run", "training", "fault tolerance")

_KEY = "sc_trainer.option"


@dataclass(frozen=True)
class Option:
    """What a field's flag needs besides the field's name, type and default."""

    help: str
    group: str
    #: the flag's names (default: ``--`` and the dest with dashes: ``--task-length``)
    flags: tuple[str, ...] = ()
    metavar: str | None = None
    #: what the help says the default is (default: the field's default; ``""``: nothing)
    default_text: str | None = None
    #: the value when the flag is not given, from the other parsed values (``None``: the
    #: field's default)
    derive: Callable[[Mapping[str, Any]], object] | None = None


def option(
    *,
    help: str,
    group: str,
    flags: tuple[str, ...] = (),
    metavar: str | None = None,
    default_text: str | None = None,
    derive: Callable[[Mapping[str, Any]], object] | None = None,
) -> dict[str, Option]:
    """The metadata that makes a dataclass field a command-line flag:
    ``field(default=..., metadata=option(help=..., group=...))``."""
    if group not in GROUPS:
        raise TrainerConfigError(f"option: group must be one of {GROUPS}, got {group!r}")
    return {_KEY: Option(help, group, flags, metavar, default_text, derive)}


def _fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field[Any], Any]]:
    """``(dest, field, type)`` of every option of ``cls`` and of its nested dataclasses."""
    hints = typing.get_type_hints(cls)
    found: list[tuple[str, dataclasses.Field[Any], Any]] = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            found.extend(_fields(kind, f"{prefix}{f.name}_"))
        elif _KEY in f.metadata:
            found.append((f"{prefix}{f.name}", f, kind))
    return found


def _unwrap_optional(kind: Any) -> Any:
    """``X`` for ``X | None``, else ``kind``."""
    if typing.get_origin(kind) in (Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per :func:`option` field of the dataclass ``cls`` (nested ones included),
    in the help groups of :data:`GROUPS`, in field order."""
    groups = {title: parser.add_argument_group(title) for title in GROUPS}
    for dest, f, kind in _fields(cls):
        opt: Option = f.metadata[_KEY]
        kind = _unwrap_optional(kind)
        shown = f.default if opt.default_text is None else opt.default_text
        text = opt.help if shown == "" else f"{opt.help} (default: {shown})"
        kwargs: dict[str, Any] = {
            "dest": dest,
            "help": text,
            "default": None if opt.derive is not None else f.default,
        }
        if typing.get_origin(kind) is Literal:
            kwargs["choices"] = typing.get_args(kind)
        elif kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif kind in (int, float):
            kwargs["type"] = kind
        if opt.metavar is not None:
            kwargs["metavar"] = opt.metavar
        flags = opt.flags or ("--" + dest.replace("_", "-"),)
        groups[opt.group].add_argument(*flags, **kwargs)


def config_kwargs(cls: type, values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The constructor arguments of ``cls`` that the parsed ``values`` (by dest) give: every
    option field, a flag not given and derived taking its derived value (or the field's
    default), and every nested configuration built from its own options."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            kwargs[f.name] = kind(**config_kwargs(kind, values, f"{prefix}{f.name}_"))
            continue
        opt: Option | None = f.metadata.get(_KEY)
        if opt is None:
            continue
        value = values[f"{prefix}{f.name}"]
        if value is None and opt.derive is not None:
            value = opt.derive(values)
        if value is not None or opt.derive is None:
            kwargs[f.name] = value
    return kwargs
