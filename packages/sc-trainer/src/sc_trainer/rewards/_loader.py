"""Finding the reward function of a run: a function in a Python file, as verl's
``custom_reward_function.path`` and ``.name`` name it, or a built-in rule reward.

A file is imported by its path under a module name of its own (``_sc_reward_<stem>_<n>``;
loading a file twice runs it twice), which is in ``sys.modules`` only while the file runs,
and with the file's folder at the front of ``sys.path`` only while it runs too: an import of
a module beside it works at the top of the file (that module stays imported, under its plain
name, as any import), and nothing of the file is left where a later import would find it.
Left out of ``sys.modules``, the module's functions pickle by value with cloudpickle, which
is how Ray ships a function to a worker (the standard :mod:`pickle` cannot pickle them).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from .._errors import RewardNotFoundError
from ._calling import remember
from ._checks import format_user_traceback, short_repr
from ._rules import boxed_score, default_compute_score, gsm8k_score

__all__ = ["BUILTIN_REWARDS", "load_reward_function", "resolve_reward_function"]

# The built-in reward functions by the names custom_reward_function.name may give them.
BUILTIN_REWARDS: dict[str, Callable[..., float]] = {
    "boxed": boxed_score,
    "boxed_score": boxed_score,
    "compute_score": default_compute_score,
    "default": default_compute_score,
    "default_compute_score": default_compute_score,
    "gsm8k": gsm8k_score,
    "gsm8k_score": gsm8k_score,
}

# sys.path and sys.modules are changed while a file runs: one file at a time.
_import_lock = threading.Lock()
_module_numbers = itertools.count()


def load_reward_function(
    path: str | os.PathLike[str], name: str = "compute_score"
) -> Callable[..., Any]:
    """The callable ``name`` of the Python file at ``path`` (``~`` expanded, a relative
    path from the working directory), the file run as a module of its own (see the module's
    docstring).

    Raises :class:`RewardNotFoundError` when the path does not exist, is not a file or not
    a ``.py`` file, when running the file raises (the message quotes the traceback; the
    error is chained from the exception), when the file has no ``name`` (the message lists
    the callables it defines) and when ``name`` is not callable."""
    file = Path(path).expanduser()
    where = f"custom_reward_function.path {os.fspath(path)!r}"
    if not file.exists():
        raise RewardNotFoundError(f"{where}: no such file")
    if not file.is_file():
        raise RewardNotFoundError(f"{where} is not a file")
    if file.suffix != ".py":
        raise RewardNotFoundError(f"{where} is not a Python file (.py)")
    file = file.resolve()
    module = _run_file(file, where)
    if not hasattr(module, name):
        defined = sorted(
            key
            for key, value in vars(module).items()
            if not key.startswith("_")
            and callable(value)
            and getattr(value, "__module__", None) == module.__name__
        )
        listed = ", ".join(defined) if defined else "none"
        raise RewardNotFoundError(
            f"{where} has no {name!r} (custom_reward_function.name); the callables it "
            f"defines: {listed}"
        )
    found = getattr(module, name)
    if not callable(found):
        raise RewardNotFoundError(
            f"{where}: {name!r} is not callable: it is {short_repr(found)} ({type(found).__name__})"
        )
    remember(found, f"{file}:{name}")
    return found  # type: ignore[no-any-return]


def resolve_reward_function(
    path: str | os.PathLike[str] | None, name: str = "compute_score"
) -> Callable[..., Any]:
    """The reward function a configuration names: with a ``path``, ``name`` in that file
    (:func:`load_reward_function`); without one (``None`` or ``""``), the built-in
    ``name``: ``"gsm8k"`` (:func:`gsm8k_score`), ``"boxed"`` (:func:`boxed_score`),
    ``"compute_score"`` or ``"default"`` (:func:`default_compute_score`), or a function's
    own name. An unknown built-in raises :class:`RewardNotFoundError` listing them."""
    if path is not None and os.fspath(path):
        return load_reward_function(path, name)
    builtin = BUILTIN_REWARDS.get(name)
    if builtin is None:
        names = ", ".join(sorted(BUILTIN_REWARDS))
        raise RewardNotFoundError(
            f"no built-in reward function {name!r} (custom_reward_function.path is not set, "
            f"so custom_reward_function.name names a built-in): the built-ins are {names}"
        )
    return builtin


def _run_file(file: Path, where: str) -> ModuleType:
    stem = re.sub(r"\W", "_", file.stem)
    module_name = f"_sc_reward_{stem}_{next(_module_numbers)}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise RewardNotFoundError(f"{where} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    folder = str(file.parent)
    with _import_lock:
        added = folder not in sys.path
        if added:
            sys.path.insert(0, folder)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as error:
            header = traceback.format_exception_only(type(error), error)[-1].strip()
            raise RewardNotFoundError(
                f"{where}: importing {file} raised {header}\n{format_user_traceback(error)}"
            ) from error
        finally:
            sys.modules.pop(module_name, None)
            if added and folder in sys.path:
                sys.path.remove(folder)
    return module
