"""What became of one call of a reward function, and whether that is a score.

A call ends in one of three ways (:class:`Returned`, :class:`Raised`, :class:`TimedOut`);
:func:`judge` turns that into a :class:`Scored` or a :class:`Failed` that says what went
wrong, in the words of :class:`~sc_trainer.rewards.RewardFunctionError`'s message.

What counts as a number (:func:`as_number`): a real number that ``float()`` converts through
``__float__``: ``int``, ``float``, ``bool`` (``True`` is 1.0, ``False`` 0.0: verl's rule
rewards often return a comparison), ``fractions.Fraction``, ``decimal.Decimal``, numpy's
scalars (``numpy.bool_`` included) and one-element arrays or tensors. ``None``, strings,
bytes, complex numbers and containers are not numbers. A score must also be finite: nan and
infinities are failures.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import numbers
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CallResult",
    "Failed",
    "Raised",
    "Returned",
    "Scored",
    "TimedOut",
    "as_number",
    "format_user_traceback",
    "judge",
    "short_repr",
]

_REPR_LIMIT = 200

# Frames of these files are the machinery around a user's call, not the user's code: they
# are left out of the tracebacks quoted in messages.
_MACHINERY = (
    str(Path(__file__).resolve().parent),
    str(Path(asyncio.__file__).resolve().parent),
    str(Path(concurrent.futures.__file__).resolve().parent),
    str(Path(threading.__file__).resolve()),
    "<frozen importlib",
)


@dataclass(frozen=True)
class Returned:
    """The call returned ``value`` (awaited already, if it was awaitable)."""

    value: object


@dataclass(frozen=True)
class Raised:
    """The call raised ``error``."""

    error: BaseException


@dataclass(frozen=True)
class TimedOut:
    """The call ran past its deadline of ``seconds``; ``detail`` says more, if anything."""

    seconds: float
    detail: str = ""


CallResult = Returned | Raised | TimedOut


@dataclass(frozen=True)
class Scored:
    """A good call: its ``score`` (finite) and the extra numeric entries of a dict result."""

    score: float
    extra: dict[str, float]


@dataclass(frozen=True)
class Failed:
    """A failed call: ``what`` happened (``"raised ValueError: ..."``, ``"timed out after
    0.5 s"``, ...) and the exception to chain from, if there is one."""

    what: str
    cause: BaseException | None


def as_number(value: object) -> float | None:
    """``value`` as a float if it is a real number (see the module's docstring), else
    ``None``. A number too large for a float is infinite."""
    if isinstance(value, bool):
        return float(value)
    if value is None or isinstance(value, (str, bytes, bytearray)):
        return None
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        return None
    if getattr(type(value), "__float__", None) is None:
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:
        return math.inf
    except (TypeError, ValueError):
        return None


def short_repr(value: object) -> str:
    """``repr(value)``, cut to a couple of hundred characters (and never raising)."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__} object whose repr raised>"
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


def format_user_traceback(error: BaseException) -> str:
    """The formatted traceback of ``error`` (its chained exceptions included), without the
    frames of the machinery that ran the call: this package, asyncio, concurrent.futures,
    threading and importlib."""
    formatted = traceback.TracebackException.from_exception(error)
    _prune(formatted, set())
    return "".join(formatted.format()).rstrip("\n")


def _prune(formatted: traceback.TracebackException, seen: set[int]) -> None:
    if id(formatted) in seen:
        return
    seen.add(id(formatted))
    kept = [f for f in formatted.stack if not f.filename.startswith(_MACHINERY)]
    if kept:
        formatted.stack = traceback.StackSummary.from_list(kept)
    for chained in (formatted.__cause__, formatted.__context__):
        if chained is not None:
            _prune(chained, seen)


def judge(result: CallResult) -> Scored | Failed:
    """Whether ``result`` is a score: a number, or a dict (any mapping) with a number under
    ``"score"``; both finite. The other entries of a dict that are numbers become
    :attr:`Scored.extra` (keys as strings); the rest of them are left out."""
    if isinstance(result, Raised):
        error = result.error
        header = traceback.format_exception_only(type(error), error)[-1].strip()
        return Failed(f"raised {header}\n{format_user_traceback(error)}", error)
    if isinstance(result, TimedOut):
        detail = f" ({result.detail})" if result.detail else ""
        cause = TimeoutError(f"the call ran past its deadline of {result.seconds:g} s")
        return Failed(f"timed out after {result.seconds:g} s{detail}", cause)
    value = result.value
    if isinstance(value, Mapping):
        return _judge_mapping(value)
    number = as_number(value)
    if number is None:
        return Failed(
            f"returned {short_repr(value)} ({type(value).__name__}), which is not a number",
            None,
        )
    if not math.isfinite(number):
        return Failed(f"returned {number!r}, which is not finite", None)
    return Scored(number, {})


def _judge_mapping(value: Mapping[object, object]) -> Scored | Failed:
    if "score" not in value:
        return Failed(f'returned a dict without a numeric "score": {short_repr(value)}', None)
    score = as_number(value["score"])
    if score is None:
        raw = short_repr(value["score"])
        return Failed(
            f'returned a dict without a numeric "score" (its "score" is {raw}): '
            f"{short_repr(value)}",
            None,
        )
    if not math.isfinite(score):
        return Failed(f'returned a dict whose "score" is {score!r}, which is not finite', None)
    extra: dict[str, float] = {}
    for key, raw_value in value.items():
        number = as_number(raw_value)
        if key != "score" and number is not None:
            extra[str(key)] = number
    return Scored(score, extra)
