"""``publish``: the names a public module exports report that module as their home.

Private: shared by the sc distributions only (each of their public modules calls
``_public.publish(globals())`` after its ``__all__``); it is not public API, and code outside
sc does not import it.

``publish`` sets ``__module__`` of each class, function and ``NewType`` that the module's
``__all__`` lists and a private module of the same distribution defines to the public
module's name, so that reprs, tracebacks and the documentation show the public path
(``sc_core.WorkerGroup``, ``sc_dispatch.ext.WorkPlan``), and pickles (Ray's included) refer
to the object there, where it also is.

``typing.get_type_hints`` evaluates a class's string annotations (``from __future__ import
annotations``) in the module that its ``__module__`` names, which lacks most of the names
they use; a user's subclass of ``sc_core.Worker`` would fail there too. So before a class
moves, ``publish`` evaluates the class's own string annotations as ``get_type_hints`` did
where the class was defined; one that cannot be evaluated yet (a name imported for type
checking only) becomes a :class:`typing.ForwardRef` bound to the defining module.

Each distribution's tests check the contract with :func:`public_modules` and :func:`problems`.
"""

from __future__ import annotations

import importlib
import pickle
import pkgutil
import sys
import typing
from collections.abc import Iterable
from types import FunctionType, GenericAlias
from typing import Any, ForwardRef, NewType

__all__ = ["problems", "public_modules", "publish"]


def publish(namespace: dict[str, Any]) -> None:
    """Make the public module whose globals are ``namespace`` the home of what it exports."""
    public = namespace["__name__"]
    for obj in (namespace[name] for name in namespace["__all__"]):
        home = _defined(obj) and obj.__module__
        if home and _private(home) and home.partition(".")[0] == public.partition(".")[0]:
            if isinstance(obj, type):
                _bind_annotations(obj, home)
            obj.__module__ = public


def _defined(obj: object) -> bool:
    """Whether ``obj`` is a class, function or ``NewType`` (on Python 3.10 an alias such as
    ``list[int]`` passes for a class)."""
    return isinstance(obj, (type, FunctionType, NewType)) and not isinstance(obj, GenericAlias)


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def _bind_annotations(cls: type, home: str) -> None:
    """Evaluate ``cls``'s own string annotations in module ``home``, as
    ``typing.get_type_hints`` does (the class namespace, then the module's)."""
    annotations = vars(cls).get("__annotations__")
    if not isinstance(annotations, dict):
        return
    module_globals = vars(sys.modules[home])
    for key, value in annotations.items():
        if not isinstance(value, str):
            continue
        try:
            annotations[key] = eval(value, dict(vars(cls)), module_globals)
        except Exception:  # evaluated later, by the caller of get_type_hints, as before
            annotations[key] = ForwardRef(value, is_argument=False, module=home, is_class=True)


def public_modules(package: str) -> list[str]:
    """``package`` and its public modules and subpackages (no part of the name starts with
    ``_``), sorted."""
    root = importlib.import_module(package)
    found = [package]
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if not _private(info.name):
            found.append(info.name)
    return sorted(found)


def problems(modules: Iterable[str]) -> list[str]:
    """What in the public ``modules`` breaks the contract, one line each: an ``__all__`` out of
    ``sorted()`` order or naming something undefined; a class, function or ``NewType`` whose
    ``__module__`` is not one of the modules that export it, or that does not pickle by
    reference; a class whose annotations ``typing.get_type_hints`` cannot resolve."""
    found: list[str] = []
    homes: dict[int, set[str]] = {}
    exported: list[tuple[str, Any]] = []
    for module_name in modules:
        module = importlib.import_module(module_name)
        names = list(module.__all__)
        if names != sorted(set(names)):
            found.append(f"{module_name}.__all__ is not sorted, or repeats a name")
        for name in names:
            obj = getattr(module, name, _MISSING)
            if obj is _MISSING:
                found.append(f"{module_name}.__all__ names {name}, which it does not define")
            elif _defined(obj):
                homes.setdefault(id(obj), set()).add(module_name)
                exported.append((f"{module_name}.{name}", obj))
    for where, obj in exported:
        if obj.__module__ not in homes[id(obj)]:
            found.append(f"{where}.__module__ is {obj.__module__!r}, not a module exporting it")
        elif pickle.loads(pickle.dumps(obj)) is not obj:
            found.append(f"{where} does not pickle by reference")
        if isinstance(obj, type):
            try:
                typing.get_type_hints(obj)
            except Exception as exc:
                found.append(f"typing.get_type_hints({where}) raises {exc!r}")
    return found


_MISSING = object()
