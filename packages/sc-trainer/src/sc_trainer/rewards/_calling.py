"""How the scorer calls a reward function: with keywords, as verl does
(``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...)``; ``extra_info``
left out for a function that takes no such parameter), on the event loop when it is an
``async def``, and under which name its failures are reported."""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import weakref
from collections.abc import Callable
from typing import Any

from .._errors import RewardNotFoundError
from ._checks import short_repr

__all__ = ["accepts_extra_info", "check_signature", "describe", "is_async_callable", "remember"]

_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")

# "path:name" of the functions load_reward_function returned, for messages.
_labels: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def remember(fn: Callable[..., Any], label: str) -> None:
    """Report the failures of ``fn`` under ``label`` (``"path/to/file.py:compute_score"``),
    where ``fn`` can be weakly referenced."""
    # one that is not weakly referenceable, or not hashable, is described as it is
    with contextlib.suppress(TypeError):
        _labels[fn] = label


def describe(fn: Callable[..., Any]) -> str:
    """The name messages give ``fn``: ``path:name`` for a function loaded from a file,
    ``module.qualname`` for one of an importable module, ``path:qualname`` for any other
    function, else its repr. A :func:`functools.partial` is described by its function."""
    try:
        known = _labels.get(fn)
    except TypeError:
        known = None
    if known is not None:
        return known
    target: Any = fn
    while isinstance(target, functools.partial):
        target = target.func
    if target is not fn:
        return describe(target)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if not isinstance(name, str):
        return short_repr(fn)
    module = getattr(target, "__module__", None)
    if isinstance(module, str) and module in sys.modules:
        return f"{module}.{name}"
    code = getattr(target, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{name}"
    return name


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` makes a coroutine: an ``async def`` function or method, a
    :func:`functools.partial` of one, or an object whose ``__call__`` is one."""
    target: Any = fn
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target):
        return True
    if inspect.isfunction(target) or inspect.ismethod(target) or isinstance(target, type):
        return False
    return inspect.iscoroutinefunction(type(target).__call__)


def accepts_extra_info(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes an ``extra_info`` keyword (by name, or through ``**kwargs``);
    ``True`` when its signature cannot be read."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    for parameter in parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return True
    found = parameters.get("extra_info")
    return found is not None and found.kind is not inspect.Parameter.POSITIONAL_ONLY


def check_signature(fn: Callable[..., Any], label: str, extra_info: bool) -> None:
    """Raise :class:`RewardNotFoundError` if ``fn`` cannot be called with the reward
    keywords (nothing is checked when its signature cannot be read)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    names = _ARGUMENTS if extra_info else _ARGUMENTS[:3]
    try:
        signature.bind(**dict.fromkeys(names))
    except TypeError as error:
        keywords = ", ".join(f"{name}=" for name in names)
        raise RewardNotFoundError(
            f"reward function {label}{signature} cannot be called as a reward function, "
            f"with the keywords {keywords} ({error}); verl's signature is "
            "compute_score(data_source, solution_str, ground_truth, extra_info=None)"
        ) from error
