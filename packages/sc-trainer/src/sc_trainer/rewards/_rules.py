r"""Rule rewards for math data sets, so that one trains without writing a reward function:
:func:`gsm8k_score` (the last ``#### <answer>``), :func:`boxed_score` (the last
``\boxed{...}``) and :func:`default_compute_score`, which picks one by ``data_source``. Each
has verl's ``compute_score`` signature."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from .._errors import RewardFunctionError

__all__ = ["boxed_score", "default_compute_score", "gsm8k_score", "last_boxed"]

# The rest of the line after "####".
_GSM8K_MARK = re.compile(r"####([^\n]*)")
# A number at the start of an answer, not running on into a word ("72 dollars" is 72,
# "72abc" is no number).
_LEADING_NUMBER = re.compile(r"\s*([-+]?(?:\d+(?:\.\d+)?|\.\d+))(?!\w)")
_BOXED = "\\boxed"
# \left and \right as delimiter sizing, not the start of \leftarrow, \rightarrow, ...
_SIZING = re.compile(r"\\(?:left|right)(?![A-Za-z])")
# LaTeX spacing commands: \! \, \; \: and "\ ".
_SPACING = re.compile(r"\\[!,;: ]")

_MATH_SOURCES = ("math", "aime", "amc", "boxed")


def gsm8k_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    format_score: float = 0.0,
) -> float:
    """1.0 when the number after the last ``####`` of ``solution_str`` equals the ground
    truth; ``format_score`` when there is a ``####`` but not that number; 0.0 without one.

    Numbers are compared exactly (as decimals, ``72.0`` equals ``72``) after removing ``,``
    and ``$``; the answer is the number that starts the rest of the line after ``####``
    (``#### $1,200 dollars`` answers 1200). A ground truth may be a number or a string, the
    whole GSM8K solution included (its own last ``####`` is the answer); one that is not a
    number is compared as text, without spaces, commas and ``$``. ``format_score`` is a
    keyword, for ``functools.partial(gsm8k_score, format_score=0.1)``."""
    answer = _last_gsm8k_answer(solution_str)
    if answer is None:
        return 0.0
    expected = str(ground_truth)
    marked = _last_gsm8k_answer(expected)
    if marked is not None:
        expected = marked
    got, want = _gsm8k_number(answer), _gsm8k_number(expected)
    if want is not None:
        return 1.0 if got is not None and got == want else float(format_score)
    squashed = _squash(expected)
    return 1.0 if squashed and _squash(answer) == squashed else float(format_score)


def boxed_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
) -> float:
    r"""1.0 when the last ``\boxed{...}`` of ``solution_str`` (braces balanced, see
    :func:`last_boxed`) equals the ground truth after light normalisation, else 0.0.

    Both sides lose their whitespace, ``$``, ``\left`` and ``\right``, the spacing commands
    ``\! \, \; \:`` and ``\ ``, and trailing ``.``; ``\dfrac`` and ``\tfrac`` become
    ``\frac``. Nothing else is rewritten: ``0.5`` and ``\frac{1}{2}`` differ. A ground truth
    holding a ``\boxed{...}`` (a whole MATH solution) is compared by its last one."""
    answer = last_boxed(solution_str)
    if answer is None:
        return 0.0
    expected = str(ground_truth)
    if _BOXED in expected:
        expected = last_boxed(expected) or expected
    want = _normalise(expected)
    return 1.0 if want and _normalise(answer) == want else 0.0


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
) -> float:
    """The rule reward for ``data_source``: :func:`gsm8k_score` when its name contains
    ``gsm8k``, :func:`boxed_score` when it contains ``math``, ``aime``, ``amc`` or ``boxed``
    (any case).

    Any other data source raises :class:`RewardFunctionError`: inside a scorer's call, so
    the row fails (raising, or counted with ``on_error="count"``), never a silent zero."""
    name = str(data_source).lower()
    if "gsm8k" in name:
        return gsm8k_score(data_source, solution_str, ground_truth, extra_info)
    if any(word in name for word in _MATH_SOURCES):
        return boxed_score(data_source, solution_str, ground_truth, extra_info)
    raise RewardFunctionError(
        f"default_compute_score has no rule for data_source {data_source!r}: it scores "
        "sources whose name contains 'gsm8k' by the last '#### <answer>', and those whose "
        "name contains 'math', 'aime', 'amc' or 'boxed' by the last \\boxed{...}; write a "
        "compute_score for this data set and name its file in custom_reward_function.path"
    )


def last_boxed(text: str) -> str | None:
    r"""What the last ``\boxed{...}`` of ``text`` whose braces balance holds, or ``None``.
    Escaped braces (``\{``, ``\}``) do not count; an unclosed ``\boxed{`` (a response cut
    short) is passed over for an earlier, complete one."""
    end = len(text)
    while True:
        start = text.rfind(_BOXED, 0, end)
        if start < 0:
            return None
        content = _braced(text, start + len(_BOXED))
        if content is not None:
            return content
        end = start


def _braced(text: str, at: int) -> str | None:
    """The contents of the group that opens at ``text[at:]`` (after spaces), braces
    balanced; ``None`` if there is no ``{`` there or it never closes."""
    while at < len(text) and text[at].isspace():
        at += 1
    if at >= len(text) or text[at] != "{":
        return None
    depth = 0
    index = at
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[at + 1 : index]
        index += 1
    return None


def _last_gsm8k_answer(text: str) -> str | None:
    answers = _GSM8K_MARK.findall(text)
    return answers[-1] if answers else None


def _gsm8k_number(answer: str) -> Decimal | None:
    match = _LEADING_NUMBER.match(answer.replace(",", "").replace("$", ""))
    return None if match is None else Decimal(match.group(1))


def _squash(text: str) -> str:
    return "".join(text.replace(",", "").replace("$", "").split()).rstrip(".")


def _normalise(text: str) -> str:
    text = _SPACING.sub("", text)
    text = _SIZING.sub("", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("$", "")
    return "".join(text.split()).rstrip(".")
