"""Static types of registered methods: what a driver-side call takes and returns.

At run time ``@register`` returns the decorated function itself. For the type checker it
returns a :class:`RegisteredMethod`, a protocol that every function meets (a function is
callable and a descriptor), with two more, phantom, type arguments: the parameters a call
through a worker group takes (the method's own, or ``...`` for per-rank modes) and the
type such a call returns. A worker group's typed spelling
(``wg.call(MyWorker.method, ...)`` in sc-core) and sc-core's mypy plugin read them back.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, overload

__all__ = ["RegisteredMethod"]

S = TypeVar("S")
P = ParamSpec("P")
Q = ParamSpec("Q")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
C_co = TypeVar("C_co", covariant=True)
T = TypeVar("T")

_Coro = Coroutine[Any, Any, T]


class RegisteredMethod(Protocol[P, R_co, Q, C_co]):
    """A ``@register``-ed method as the type checker sees it.

    ``P`` are the method's parameters after ``self`` and ``R`` its return type. ``Q`` and
    ``C`` describe a call through a worker group: it takes the parameters ``Q`` (``P``
    itself, or ``...`` for modes whose driver-side arguments are per-rank lists) and returns
    ``C`` (``list[R]``, ``R``, or ``Any``, by mode; for an ``async def`` method ``R`` is what
    the coroutine returns). Looked up on the class (``MyWorker.method``) it stays a
    ``RegisteredMethod``, callable as ``(self, *P) -> R``; looked up on an instance it is the
    bound method ``(*P) -> R``, so the method keeps its signature everywhere.
    """

    __name__: str
    __qualname__: str

    # ``self`` is typed ``Any``: a type parameter for it would make every override of a
    # registered method in a subclass an incompatible override (it would be contravariant).
    def __call__(self, instance: Any, /, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    @overload
    def __get__(
        self, instance: None, owner: type[Any], /
    ) -> RegisteredMethod[P, R_co, Q, C_co]: ...

    @overload
    def __get__(self, instance: object, owner: type[Any], /) -> Callable[P, R_co]: ...


# The decorators ``register(...)`` returns, one per call kind. An ``async def`` method's
# call through a worker group returns what the coroutine returns, hence two overloads for
# methods (the first narrower than the second, on purpose); a function without parameters
# (not a method) keeps its plain type. No two overloads may match one method with
# different results, or mypy would type a method whose signature mentions ``Any`` as
# ``Any`` (its rule for ambiguous overloads).


class ListDecorator(Protocol):
    """``@register`` for a mode that returns ``list[R]``, with the method's own arguments."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], _Coro[T]], /
    ) -> RegisteredMethod[P, _Coro[T], P, list[T]]: ...

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], R], /
    ) -> RegisteredMethod[P, R, P, list[R]]: ...

    @overload
    def __call__(self, func: Callable[[], R], /) -> Callable[[], R]: ...


class ResultDecorator(Protocol):
    """``@register`` for a mode that returns ``R``, with the method's own arguments."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], _Coro[T]], /
    ) -> RegisteredMethod[P, _Coro[T], P, T]: ...

    @overload
    def __call__(self, func: Callable[Concatenate[S, P], R], /) -> RegisteredMethod[P, R, P, R]: ...

    @overload
    def __call__(self, func: Callable[[], R], /) -> Callable[[], R]: ...


class PerRankListDecorator(Protocol):
    """``@register`` for a mode that returns ``list[R]`` from per-rank arguments."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], _Coro[T]], /
    ) -> RegisteredMethod[P, _Coro[T], ..., list[T]]: ...

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], R], /
    ) -> RegisteredMethod[P, R, ..., list[R]]: ...

    @overload
    def __call__(self, func: Callable[[], R], /) -> Callable[[], R]: ...


class FutureDecorator(Protocol):
    """``@register(..., blocking=False)`` for a mode that takes the method's own arguments:
    a call returns futures, typed ``Any``."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], R], /
    ) -> RegisteredMethod[P, R, P, Any]: ...

    @overload
    def __call__(self, func: Callable[[], R], /) -> Callable[[], R]: ...


class UntypedDecorator(Protocol):
    """``@register`` whose call kind is unknown to the type checker (a custom mode, an
    explicit ``execute_mode``, a ``blocking`` that is not a literal): a call takes anything
    and returns ``Any``."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], R], /
    ) -> RegisteredMethod[P, R, ..., Any]: ...

    @overload
    def __call__(self, func: Callable[[], R], /) -> Callable[[], R]: ...
