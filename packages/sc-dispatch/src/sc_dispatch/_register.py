"""``@register``: declare how a worker method is dispatched, executed and collected."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar, cast, overload

from ._enums import CollectsList, CollectsResult, Dispatch, Execute, PerRankCollectsList
from ._errors import DispatchModeTypeError, InvalidDispatchModeError
from ._nd import MeshDispatchFnDict
from ._registry import resolve_dispatch_mode
from ._shard import is_future
from ._typed import (
    FutureDecorator,
    ListDecorator,
    PerRankListDecorator,
    ResultDecorator,
    UntypedDecorator,
)

__all__ = ["MAGIC_ATTR", "RegisterAttrs", "get_register_attrs", "materialize", "register"]

P = ParamSpec("P")
R = TypeVar("R")

#: Attribute under which ``@register`` stores its settings (verl's value).
MAGIC_ATTR = "attrs_3141562937"


@dataclass(frozen=True)
class RegisterAttrs:
    """The settings ``@register`` attached to a method."""

    dispatch_mode: Dispatch | Mapping[str, Any]
    execute_mode: Execute
    blocking: bool
    materialize_futures: bool


def materialize(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Replace every registered future among the arguments by its value (``get()``)."""
    new_args = tuple(a.get() if is_future(a) else a for a in args)
    new_kwargs = {k: (v.get() if is_future(v) else v) for k, v in kwargs.items()}
    return new_args, new_kwargs


def _has_future(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(is_future(v) for v in (*args, *kwargs.values()))


async def _materialize_async(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """:func:`materialize` for ``async def`` methods: ``get()`` blocks, so it runs on a
    thread and the event loop stays free. A future produced by another ``async`` method of
    the same worker (an asyncio actor runs all its methods on one loop) can then finish
    while this method waits for it, instead of the two waiting for each other forever."""
    if not _has_future(args, kwargs):
        return args, kwargs
    return await asyncio.to_thread(materialize, args, kwargs)


# The overloads tell the type checker what a call through a worker group returns (see
# ``_typed``); they only apply when ``execute_mode`` is left at its default. At run time
# every variant returns the decorated function with its settings attached. The marker
# types (``CollectsList``...) are NewTypes of ``Dispatch``, so mypy reports the overloads as
# overlapping ([overload-overlap]); they are ordered narrowest first on purpose.
# ``unused-ignore`` keeps the comment valid for checkers that do not report the overlap.


@overload
def register(  # type: ignore[overload-overlap, unused-ignore]
    dispatch_mode: CollectsList,
    execute_mode: None = None,
    blocking: Literal[True] = True,
    materialize_futures: bool = True,
) -> ListDecorator: ...


@overload
def register(  # type: ignore[overload-overlap, unused-ignore]
    dispatch_mode: CollectsResult | MeshDispatchFnDict,
    execute_mode: None = None,
    blocking: Literal[True] = True,
    materialize_futures: bool = True,
) -> ResultDecorator: ...


@overload
def register(
    dispatch_mode: PerRankCollectsList = ...,
    execute_mode: None = None,
    blocking: Literal[True] = True,
    materialize_futures: bool = True,
) -> PerRankListDecorator: ...


@overload
def register(  # type: ignore[overload-overlap, unused-ignore]
    dispatch_mode: CollectsList | CollectsResult | MeshDispatchFnDict,
    execute_mode: None = None,
    *,
    blocking: Literal[False],
    materialize_futures: bool = True,
) -> FutureDecorator: ...


@overload
def register(
    dispatch_mode: Dispatch | Mapping[str, Any] = ...,
    execute_mode: Execute | None = None,
    blocking: bool = True,
    materialize_futures: bool = True,
) -> UntypedDecorator: ...


def register(
    dispatch_mode: Dispatch | Mapping[str, Any] = Dispatch.ALL_TO_ALL,
    execute_mode: Execute | None = None,
    blocking: bool = True,
    materialize_futures: bool = True,
) -> Any:
    """Mark a worker method as callable through a worker group.

    ``dispatch_mode`` is a :class:`Dispatch` member or a mapping
    ``{"dispatch_fn": ..., "collect_fn": ...}``; ``execute_mode`` defaults to
    ``Execute.RANK_ZERO`` for ``Dispatch.RANK_ZERO`` and ``Execute.ALL`` otherwise;
    ``blocking=False`` makes the driver-side call return futures; ``materialize_futures``
    resolves future arguments (``get()``) before the method runs. Works on plain and
    ``async def`` methods, and returns the function itself, with the same signature.

    For the type checker the result is a :class:`~sc_dispatch.RegisteredMethod` that also
    records what a call through a worker group takes and returns: ``list[R]`` for
    :data:`~sc_dispatch.CollectsList` modes, ``R`` for :data:`~sc_dispatch.CollectsResult`
    modes and N-d mesh modes, ``list[R]`` from unchecked per-rank arguments for
    :data:`~sc_dispatch.PerRankCollectsList` modes (``R`` being what the method, or its
    coroutine, returns); ``Any`` for non-blocking methods, other custom modes and an
    explicit ``execute_mode``.
    """
    if isinstance(dispatch_mode, Mapping):
        resolve_dispatch_mode(dispatch_mode)  # validates both functions now, not at call time
    elif not isinstance(dispatch_mode, Dispatch):
        raise DispatchModeTypeError(
            f"register: dispatch_mode must be a Dispatch member or a mapping with 'dispatch_fn' "
            f"and 'collect_fn', got {type(dispatch_mode).__qualname__} {dispatch_mode!r}"
        )
    if execute_mode is None:
        execute_mode = Execute.RANK_ZERO if dispatch_mode is Dispatch.RANK_ZERO else Execute.ALL
    if not isinstance(execute_mode, Execute):
        raise DispatchModeTypeError(
            f"register: execute_mode must be an Execute member, got {execute_mode!r}"
        )
    if dispatch_mode is Dispatch.RANK_ZERO and execute_mode is not Execute.RANK_ZERO:
        raise InvalidDispatchModeError(
            f"register: Dispatch.RANK_ZERO runs on rank 0 only and needs Execute.RANK_ZERO, "
            f"got {execute_mode!r}"
        )
    for name, flag in (("blocking", blocking), ("materialize_futures", materialize_futures)):
        if not isinstance(flag, bool):
            raise DispatchModeTypeError(f"register: {name} must be a bool, got {flag!r}")
    attrs = RegisterAttrs(dispatch_mode, execute_mode, blocking, materialize_futures)

    def decorator(func: Callable[P, R]) -> Callable[P, R]:
        if not callable(func):
            raise DispatchModeTypeError(f"register: expected a function, got {func!r}")
        wrapped: Callable[..., Any]
        if not materialize_futures:
            wrapped = func
        elif inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_inner(*args: Any, **kwargs: Any) -> Any:
                args, kwargs = await _materialize_async(args, kwargs)
                return await func(*args, **kwargs)

            wrapped = async_inner
        else:

            @functools.wraps(func)
            def inner(*args: Any, **kwargs: Any) -> Any:
                args, kwargs = materialize(args, kwargs)
                return func(*args, **kwargs)

            wrapped = inner
        setattr(
            wrapped,
            MAGIC_ATTR,
            {
                "dispatch_mode": attrs.dispatch_mode,
                "execute_mode": attrs.execute_mode,
                "blocking": attrs.blocking,
                "materialize_futures": attrs.materialize_futures,
            },
        )
        return cast("Callable[P, R]", wrapped)

    return decorator


def get_register_attrs(func: object) -> RegisterAttrs | None:
    """The settings of a ``@register``-ed method, or ``None`` if it was not registered."""
    raw = getattr(func, MAGIC_ATTR, None)
    if not isinstance(raw, Mapping):
        return None
    try:
        return RegisterAttrs(
            dispatch_mode=raw["dispatch_mode"],
            execute_mode=raw["execute_mode"],
            blocking=bool(raw["blocking"]),
            materialize_futures=bool(raw.get("materialize_futures", True)),
        )
    except KeyError as exc:
        raise InvalidDispatchModeError(
            f"{getattr(func, '__qualname__', func)!r} carries {MAGIC_ATTR} without {exc.args[0]!r}"
        ) from None
