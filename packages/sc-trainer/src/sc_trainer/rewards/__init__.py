r"""Reward functions written the way verl users write them, and scored in parallel.

A reward function has verl's signature, ``compute_score(data_source, solution_str,
ground_truth, extra_info=None)``, and returns a number or a dict with a number under
``"score"`` (its other numeric entries become metrics); it may be ``async def``.
:func:`resolve_reward_function` finds the one a configuration names
(``custom_reward_function.path`` and ``.name``): a function in a Python file
(:func:`load_reward_function`), or a built-in rule reward: :func:`gsm8k_score` (the last
``#### <answer>``), :func:`boxed_score` (the last ``\boxed{...}``) or
:func:`default_compute_score` (one of the two, by ``data_source``). Any callable of that
signature will do, as TRL's ``reward_funcs`` are plain callables.

:class:`RewardScorer` scores a batch of :class:`RewardInput` rows into a
:class:`RewardOutcome`: the calls in parallel (threads, or tasks on the scorer's event loop
for an ``async`` function), each under its own deadline. A failure (the function raised, ran
past its deadline, returned no number or a number that is not finite) is never a silent
zero: the batch raises :class:`RewardFunctionError` naming the row, its ``data_source`` and
what happened, unless the scorer counts failures (``on_error="count"``: the row scores 0.0
and the outcome counts and lists it). :class:`RewardNotFoundError` is a function that cannot
be found.
"""

from sc_dispatch import _public

from .._errors import RewardFunctionError, RewardNotFoundError
from ._loader import load_reward_function, resolve_reward_function
from ._rules import boxed_score, default_compute_score, gsm8k_score
from ._scorer import RewardScorer
from ._types import RewardInput, RewardOutcome

__all__ = [
    "RewardFunctionError",
    "RewardInput",
    "RewardNotFoundError",
    "RewardOutcome",
    "RewardScorer",
    "boxed_score",
    "default_compute_score",
    "gsm8k_score",
    "load_reward_function",
    "resolve_reward_function",
]

_public.publish(globals())
