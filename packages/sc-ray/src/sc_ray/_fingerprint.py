"""Fingerprints of a worker: its code and its configuration, compared when a driver
re-attaches to a run (``_run.py``).

A fingerprint is ``{"code": {module: sha256}, "config": {dotted path: repr}}``:

* ``code``: the sha256 of the source text of every module that defines a class in the
  worker class's MRO (and, for a colocated class, in its role classes' MROs:
  ``raw_cls_dict``, or the roles sc-ray's colocation functions record in
  :data:`ROLE_INITS_ATTR`), skipping the standard library and modules without source;
* ``config``: the constructor's arguments (bound to its parameter names where the
  signature allows, else ``args.<i>`` and the keyword names) flattened to dotted paths:
  dataclasses by field, mappings by key, sequences by index (up to
  :data:`SEQUENCE_LIMIT` items), recursively; everything else by ``repr`` (memory
  addresses removed); a colocated class's roles add theirs under ``<role>.``. sc's own
  private keywords (``_sc_env``, ``_sc_standby``) are never part of it.

The actor class (``_actor_class.py``) records its fingerprint at construction;
:func:`expected_fingerprint` computes, on the driver, what a new worker would record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ROLE_INITS_ATTR",
    "SEQUENCE_LIMIT",
    "Fingerprint",
    "code_fingerprint",
    "config_fingerprint",
    "fingerprint",
    "fingerprint_differences",
]

#: The attribute of a colocated class (set by ``_colocate.py``) holding each role's class
#: and constructor arguments: ``{role: (class, args, kwargs)}``.
ROLE_INITS_ATTR = "_sc_role_inits"
#: Sequences longer than this are compared by their whole ``repr``.
SEQUENCE_LIMIT = 16
_MAX_DEPTH = 12
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_PRIVATE_KWARGS = frozenset({"_sc_env", "_sc_standby"})

#: ``{"code": {module: sha256}, "config": {dotted path: repr}}``
Fingerprint = dict[str, dict[str, str]]


def _is_stdlib(module_name: str) -> bool:
    top = module_name.partition(".")[0]
    return top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ())


def _role_inits(cls: type) -> dict[str, tuple[type, Sequence[Any], Mapping[str, Any]]]:
    raw: Mapping[str, Any] = getattr(cls, ROLE_INITS_ATTR, None) or {}
    return {str(role): init for role, init in raw.items()}


def _classes(cls: type) -> list[type]:
    roles: Mapping[str, Any] = getattr(cls, "raw_cls_dict", None) or {}
    out: list[type] = list(cls.__mro__)
    for role in [*roles.values(), *(init[0] for init in _role_inits(cls).values())]:
        if isinstance(role, type):
            out.extend(role.__mro__)
    return out


def code_fingerprint(cls: type) -> dict[str, str]:
    """``{module name: sha256 of its source}`` for the modules defining ``cls``'s classes."""
    out: dict[str, str] = {}
    for klass in _classes(cls):
        name = klass.__module__
        if name in out or _is_stdlib(name):
            continue
        module = sys.modules.get(name)
        if module is None:
            continue
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):  # no source (a compiled or generated module)
            continue
        out[name] = hashlib.sha256(source.encode()).hexdigest()
    return out


def _repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:  # a repr that fails must not fail the worker's constructor
        return f"<{type(value).__qualname__} without repr>"
    return _ADDRESS.sub("", text)


def _flatten(path: str, value: object, out: dict[str, str], depth: int) -> None:
    if depth > _MAX_DEPTH:
        out[path] = _repr(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        if not fields:
            out[path] = _repr(value)
        for field in fields:
            _flatten(f"{path}.{field.name}", getattr(value, field.name, None), out, depth + 1)
    elif isinstance(value, Mapping) and value:
        for key, item in value.items():
            _flatten(f"{path}.{key}", item, out, depth + 1)
    elif (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes, bytearray))
        and 0 < len(value) <= SEQUENCE_LIMIT
    ):
        for index, item in enumerate(value):
            _flatten(f"{path}.{index}", item, out, depth + 1)
    else:
        out[path] = _repr(value)


def _bound(cls: type, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    try:
        bound = inspect.signature(cls).bind(*args, **kwargs)
    except (TypeError, ValueError):  # no signature, or arguments it does not take
        return {**{f"args.{i}": a for i, a in enumerate(args)}, **kwargs}
    return dict(bound.arguments)


def config_fingerprint(cls: type, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, str]:
    """The constructor arguments of ``cls`` as ``{dotted path: repr}``."""
    public = {k: v for k, v in kwargs.items() if k not in _PRIVATE_KWARGS}
    out: dict[str, str] = {}
    for name, value in _bound(cls, args, public).items():
        try:
            _flatten(name, value, out, 0)
        except Exception:  # an odd container (its items fail): compared by its repr
            out[name] = _repr(value)
    for role, (role_cls, role_args, role_kwargs) in _role_inits(cls).items():
        for path, text in config_fingerprint(role_cls, role_args, role_kwargs).items():
            out[f"{role}.{path}"] = text
    return out


def fingerprint(
    cls: type, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
) -> Fingerprint:
    """The fingerprint of a worker of ``cls`` built with ``args``/``kwargs`` (``None``: a
    spare that built no worker yet, which has code only)."""
    config = {} if args is None or kwargs is None else config_fingerprint(cls, args, kwargs)
    return {"code": code_fingerprint(cls), "config": config}


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fingerprint_differences(theirs: Fingerprint, ours: Fingerprint) -> list[str]:
    """What differs between a running worker's fingerprint (``theirs``) and the one this
    driver would give a new worker (``ours``), one line per module or dotted path."""
    lines = [
        f"code: module {module} differs (sha256 {(a or 'absent')[:12]} on the run's "
        f"workers vs {(b or 'absent')[:12]} for this driver)"
        for module, a, b in _changed(theirs, ours, "code")
    ]
    lines.extend(
        f"{path}: the run's workers have {_short(a or '<absent>')}, this "
        f"driver {_short(b or '<absent>')}"
        for path, a, b in _changed(theirs, ours, "config")
    )
    return lines


def _changed(
    theirs: Fingerprint, ours: Fingerprint, part: str
) -> list[tuple[str, str | None, str | None]]:
    """The keys of ``part`` whose values differ (absent on one side: ``None``), sorted, with
    the run's value and this driver's."""
    a, b = theirs.get(part, {}), ours.get(part, {})
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
