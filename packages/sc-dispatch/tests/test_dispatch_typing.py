"""Registered methods keep their signatures for the type checker (checked by mypy --strict).

The ``# type: ignore[...]`` comments below are load-bearing: mypy --strict warns about unused
ignores, so if ``@register`` erased a signature to ``Callable[..., Any]`` these lines would
stop being errors and the typecheck session would fail.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from sc_dispatch import Dispatch, register


class Worker:
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def scale(self, data: list[int], factor: int = 2) -> list[int]:
        return [x * factor for x in data]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def ping(self, *, tag: str) -> str:
        return f"pong {tag}"


# Exact callable types: assignment fails under mypy if a parameter or the result changes.
scale_fn: Callable[[Worker, list[int], int], list[int]] = Worker.scale


class PingMethod(Protocol):
    def __call__(self, *, tag: str) -> Coroutine[Any, Any, str]: ...


ping_fn: PingMethod = Worker().ping


if TYPE_CHECKING:
    _bad_arg = Worker().scale("not a list")  # type: ignore[arg-type]
    _bad_result: str = Worker().scale([1])  # type: ignore[assignment]
    _bad_kw = Worker().ping(tag=3)  # type: ignore[arg-type]
    _missing_kw = Worker().ping()  # type: ignore[call-arg]


def test_signatures_survive_at_run_time() -> None:
    assert str(inspect.signature(Worker.scale)) == (
        "(self, data: 'list[int]', factor: 'int' = 2) -> 'list[int]'"
    )
    assert str(inspect.signature(Worker.ping)) == "(self, *, tag: 'str') -> 'str'"


def test_typed_aliases_call_through() -> None:
    assert scale_fn(Worker(), [1, 2], 3) == [3, 6]
    assert asyncio.run(ping_fn(tag="x")) == "pong x"
