"""Reward functions the verl way (sc_trainer.rewards): loading a compute_score from a file,
the built-in rule rewards, and the scorer: calls in parallel (threads, or tasks on its event
loop), one deadline per call, a hung call that does not starve later batches, and failures
that raise (or are counted) but are never a silent zero.

Parallelism is shown with barriers and events that only open when every call is in flight;
the only blocking without an end is inside the hanging functions, released at teardown."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import math
import re
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_trainer import TrainerConfigError
from sc_trainer.rewards import (
    RewardFunctionError,
    RewardInput,
    RewardNotFoundError,
    RewardOutcome,
    RewardScorer,
    boxed_score,
    default_compute_score,
    gsm8k_score,
    load_reward_function,
    resolve_reward_function,
)
from sc_trainer.trainer import TrainerStateError

pytestmark = pytest.mark.timeout(60)

# A hung call must be given up on well within this (its deadline is a fraction of a second).
GIVE_UP_BOUND_S = 5.0


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def rows(*solutions: str, data_source: str = "test/source") -> list[RewardInput]:
    return [RewardInput(data_source, s, "gt", row=i) for i, s in enumerate(solutions)]


@pytest.fixture
def never() -> Iterator[threading.Event]:
    """An event the hanging functions block on; set at teardown so their threads end."""
    event = threading.Event()
    yield event
    event.set()


# --- loading ------------------------------------------------------------------------------


def test_load_a_compute_score_from_a_file_leaves_nothing_behind(tmp_path: Path) -> None:
    write(tmp_path, "sc_reward_helper_mod.py", "def bonus() -> float:\n    return 0.5\n")
    path = write(
        tmp_path,
        "my_reward.py",
        """
        from sc_reward_helper_mod import bonus

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return float(solution_str == ground_truth) + bonus()

        def other(data_source, solution_str, ground_truth, extra_info=None):
            return -1.0
        """,
    )
    try:
        fn = load_reward_function(path)
        assert fn("d", "a", "a") == 1.5
        assert load_reward_function(str(path), "other")("d", "a", "a") == -1.0
    finally:
        sys.modules.pop("sc_reward_helper_mod", None)
    assert fn.__module__ not in sys.modules
    assert str(tmp_path) not in sys.path
    assert load_reward_function(path) is not fn  # run again, as a module of its own


def test_a_loaded_function_is_named_by_path_and_name_in_messages(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "bad_reward.py",
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return None
        """,
    )
    with RewardScorer(load_reward_function(path)) as scorer:
        assert scorer.label == f"{path.resolve()}:compute_score"
        with pytest.raises(RewardFunctionError, match=r"bad_reward\.py:compute_score failed"):
            scorer.score(rows("x"))


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("absent.py", None, "no such file"),
        ("folder", "", "is not a file"),
        ("reward.txt", "def compute_score(*a): return 1\n", r"not a Python file \(\.py\)"),
    ],
)
def test_load_rejects_a_path_that_is_no_python_file(
    tmp_path: Path, name: str, content: str | None, match: str
) -> None:
    path = tmp_path / name
    if name == "folder":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(RewardNotFoundError, match=match):
        load_reward_function(path)


def test_load_reports_a_file_that_raises_on_import(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "broken.py",
        """
        LIMIT = 1 // 0  # the marker line

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0
        """,
    )
    with pytest.raises(RewardNotFoundError) as caught:
        load_reward_function(path)
    message = str(caught.value)
    assert "raised ZeroDivisionError: integer division or modulo by zero" in message
    assert "broken.py" in message
    assert "the marker line" in message  # the traceback quotes the source
    assert "importlib" not in message
    assert isinstance(caught.value.__cause__, ZeroDivisionError)
    assert str(tmp_path) not in sys.path


def test_load_reports_a_syntax_error(tmp_path: Path) -> None:
    path = write(tmp_path, "syntax.py", "def compute_score(:\n")
    with pytest.raises(RewardNotFoundError, match="SyntaxError") as caught:
        load_reward_function(path)
    assert isinstance(caught.value.__cause__, SyntaxError)


def test_load_lists_the_callables_a_file_defines_when_the_name_is_missing(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "named.py",
        """
        from math import sqrt

        def beta_score(data_source, solution_str, ground_truth, extra_info=None):
            return sqrt(1.0)

        class Alpha:
            pass

        def _private():
            pass
        """,
    )
    with pytest.raises(RewardNotFoundError) as caught:
        load_reward_function(path)
    message = str(caught.value)
    assert "has no 'compute_score'" in message
    assert message.endswith("the callables it defines: Alpha, beta_score")
    empty = write(tmp_path, "empty.py", "VALUE = 1\n")
    with pytest.raises(RewardNotFoundError, match="the callables it defines: none"):
        load_reward_function(empty, "score_it")


def test_load_rejects_a_name_that_is_not_callable(tmp_path: Path) -> None:
    path = write(tmp_path, "number.py", "compute_score = 3\n")
    with pytest.raises(
        RewardNotFoundError, match=r"'compute_score' is not callable: it is 3 \(int\)"
    ):
        load_reward_function(path)


def test_resolve_a_builtin_by_name_or_a_file(tmp_path: Path) -> None:
    assert resolve_reward_function(None, "gsm8k") is gsm8k_score
    assert resolve_reward_function(None, "boxed") is boxed_score
    assert resolve_reward_function(None) is default_compute_score
    assert resolve_reward_function("", "default") is default_compute_score
    path = write(tmp_path, "r.py", "def judge(**kwargs):\n    return 0.25\n")
    assert resolve_reward_function(path, "judge")() == 0.25
    with pytest.raises(RewardNotFoundError, match=r"'nope'.*boxed, boxed_score, compute_score"):
        resolve_reward_function(None, "nope")


# --- scoring: parallelism -----------------------------------------------------------------


def test_sync_calls_run_in_parallel_on_threads() -> None:
    barrier = threading.Barrier(4, timeout=GIVE_UP_BOUND_S)  # opens once all 4 are in flight
    threads: set[str] = set()

    def meet(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> float:
        threads.add(threading.current_thread().name)
        barrier.wait()
        return float(solution_str)

    with RewardScorer(meet, max_workers=4, timeout_s=30.0) as scorer:
        assert not scorer.is_async
        outcome = scorer.score(rows("1", "2", "3", "4"))
    assert outcome.scores == [1.0, 2.0, 3.0, 4.0]
    assert outcome.failures == 0
    assert len(threads) == 4


def test_no_more_than_max_workers_calls_at_once() -> None:
    lock = threading.Lock()
    in_flight = [0]
    peak = [0]
    pairs = threading.Barrier(2, timeout=GIVE_UP_BOUND_S)

    def pair_up(data_source: str, solution_str: str, ground_truth: Any) -> float:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        pairs.wait()
        with lock:
            in_flight[0] -= 1
        return 1.0

    with RewardScorer(pair_up, max_workers=2) as scorer:
        assert scorer.score(rows(*"abcdef")).scores == [1.0] * 6
    assert peak[0] == 2


def test_async_calls_run_concurrently_on_one_loop_across_batches() -> None:
    arrived = [0]
    everyone: dict[str, asyncio.Event] = {}
    loops: set[int] = set()
    thread_names: set[str] = set()

    async def gather_all(data_source: str, solution_str: str, ground_truth: Any) -> float:
        loops.add(id(asyncio.get_running_loop()))
        thread_names.add(threading.current_thread().name)
        event = everyone.setdefault(solution_str[0], asyncio.Event())
        arrived[0] += 1
        if arrived[0] % 5 == 0:
            event.set()
        await event.wait()  # opens only when all five calls of the batch are in flight
        return 2.0

    with RewardScorer(gather_all, max_workers=5, timeout_s=GIVE_UP_BOUND_S) as scorer:
        assert scorer.is_async
        assert scorer.score(rows("a1", "a2", "a3", "a4", "a5")).scores == [2.0] * 5
        assert scorer.score(rows("b1", "b2", "b3", "b4", "b5")).scores == [2.0] * 5
    assert len(loops) == 1
    assert all(name.startswith("sc-reward-loop") for name in thread_names)


def test_async_detection_covers_partials_and_callable_objects() -> None:
    async def scored(data_source: str, solution_str: str, ground_truth: Any, bonus: float) -> float:
        return 1.0 + bonus

    class Judge:
        async def __call__(self, data_source: str, solution_str: str, ground_truth: Any) -> float:
            return 0.5

    with RewardScorer(functools.partial(scored, bonus=0.5)) as partial_scorer:
        assert partial_scorer.is_async
        assert partial_scorer.score(rows("x")).scores == [1.5]
    with RewardScorer(Judge()) as object_scorer:
        assert object_scorer.is_async
        assert object_scorer.score(rows("x")).scores == [0.5]


def test_a_sync_function_returning_an_awaitable_is_awaited() -> None:
    async def later(value: float) -> float:
        await asyncio.sleep(0)
        return value

    def deferred(
        data_source: str, solution_str: str, ground_truth: Any
    ) -> Coroutine[Any, Any, float]:
        return later(float(solution_str))

    with RewardScorer(deferred) as scorer:
        assert not scorer.is_async
        assert scorer.score(rows("3", "4")).scores == [3.0, 4.0]


# --- scoring: results ---------------------------------------------------------------------


def test_dict_results_give_extra_metrics_with_nan_where_missing() -> None:
    results: dict[str, object] = {
        "a": {"score": 1, "acc": True, "length": 3},
        "b": {"score": 0.5, "acc": False, "pred": "text"},
        "c": 2.0,
        "d": {"score": np.float32(0.25), "length": np.int64(7)},
    }

    def lookup(data_source: str, solution_str: str, ground_truth: Any) -> object:
        return results[solution_str]

    with RewardScorer(lookup) as scorer:
        outcome = scorer.score(rows("a", "b", "c", "d"))
    assert outcome.scores == [1.0, 0.5, 2.0, 0.25]
    assert list(outcome.extra) == ["acc", "length"]  # "pred" is no number: left out
    assert outcome.extra["acc"][:2] == [1.0, 0.0]
    assert all(math.isnan(v) for v in outcome.extra["acc"][2:])
    length = outcome.extra["length"]
    assert length[0] == 3.0
    assert length[3] == 7.0
    assert math.isnan(length[1])
    assert math.isnan(length[2])


@pytest.mark.parametrize(
    ("value", "score"),
    [
        (True, 1.0),
        (False, 0.0),
        (3, 3.0),
        (Fraction(1, 4), 0.25),
        (Decimal("0.5"), 0.5),
        (np.float64(0.75), 0.75),
        (np.bool_(True), 1.0),
        (np.array(2.0), 2.0),
    ],
)
def test_numbers_of_every_kind_are_scores(value: object, score: float) -> None:
    with RewardScorer(lambda data_source, solution_str, ground_truth: value) as scorer:
        assert scorer.score(rows("x")).scores == [score]


def test_extra_info_is_passed_when_the_function_takes_it() -> None:
    seen: list[object] = []

    def takes(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> float:
        seen.append(extra_info)
        return 1.0

    def through_kwargs(**kwargs: Any) -> float:
        seen.append(sorted(kwargs))
        return 1.0

    def without(data_source: str, solution_str: str, ground_truth: Any) -> float:
        return 1.0

    row = [RewardInput("d", "s", "g", extra_info={"split": "train"})]
    for fn in (takes, through_kwargs, without):
        with RewardScorer(fn) as scorer:
            assert scorer.score(row).scores == [1.0]
    assert seen == [
        {"split": "train"},
        ["data_source", "extra_info", "ground_truth", "solution_str"],
    ]


def test_an_empty_batch_and_rows_without_an_index() -> None:
    def bad(data_source: str, solution_str: str, ground_truth: Any) -> object:
        return None if solution_str == "bad" else 1.0

    with RewardScorer(bad, on_error="count") as scorer:
        assert scorer.score([]) == RewardOutcome([])
        outcome = scorer.score([RewardInput("d", "ok", 1), RewardInput("d", "bad", 1)])
    assert outcome.failed_rows == [1]  # the position stands in for the row's index


# --- scoring: failures --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ("abc", "returned 'abc' (str), which is not a number"),
        (None, "returned None (NoneType), which is not a number"),
        (complex(1, 0), "returned (1+0j) (complex), which is not a number"),
        ([1.0], "returned [1.0] (list), which is not a number"),
        (np.array([1.0, 2.0]), "(ndarray), which is not a number"),
        (math.nan, "returned nan, which is not finite"),
        (-math.inf, "returned -inf, which is not finite"),
        (10**400, "returned inf, which is not finite"),
        ({"acc": 1.0}, "returned a dict without a numeric \"score\": {'acc': 1.0}"),
        ({"score": "1"}, 'without a numeric "score" (its "score" is \'1\')'),
        ({"score": None}, 'without a numeric "score" (its "score" is None)'),
        ({"score": math.inf}, 'returned a dict whose "score" is inf, which is not finite'),
    ],
)
def test_a_result_that_is_no_finite_number_raises_naming_the_row(value: object, what: str) -> None:
    def returns(data_source: str, solution_str: str, ground_truth: Any) -> object:
        return value if solution_str == "bad" else 1.0

    row = [RewardInput("ok/source", "fine", 0, row=16), RewardInput("my/source", "bad", 0, row=17)]
    scorer = RewardScorer(returns, label="the_fn")
    with scorer, pytest.raises(RewardFunctionError, match=re.escape(what)) as caught:
        scorer.score(row)
    message = str(caught.value)
    assert message.startswith("reward function the_fn failed on row 17 (data_source 'my/source'): ")
    assert caught.value.__cause__ is None


def test_a_function_that_raises_names_the_row_and_quotes_the_traceback() -> None:
    def explodes(data_source: str, solution_str: str, ground_truth: Any) -> float:
        if solution_str == "boom":
            raise KeyError("missing-key-xyz")  # the user's line, quoted
        return 1.0

    with RewardScorer(explodes) as scorer, pytest.raises(RewardFunctionError) as caught:
        scorer.score(rows("ok", "boom", data_source="gsm8k/main"))
    message = str(caught.value)
    assert (
        "failed on row 1 (data_source 'gsm8k/main'): raised KeyError: 'missing-key-xyz'" in message
    )
    assert "test_trainer_rewards.py" in message
    assert "in explodes" in message
    assert "# the user's line, quoted" in message
    assert "_threads.py" not in message
    assert "concurrent" not in message
    assert isinstance(caught.value.__cause__, KeyError)


def test_even_system_exit_in_a_reward_function_is_a_failed_row() -> None:
    def exits(data_source: str, solution_str: str, ground_truth: Any) -> float:
        raise SystemExit(3)

    scorer = RewardScorer(exits)
    with scorer, pytest.raises(RewardFunctionError, match="raised SystemExit: 3"):
        scorer.score(rows("x"))


def test_the_first_failure_in_input_order_is_the_one_raised() -> None:
    second_failed = threading.Event()

    def ordered(data_source: str, solution_str: str, ground_truth: Any) -> float:
        if solution_str == "first":
            if not second_failed.wait(GIVE_UP_BOUND_S):  # fails after the next row did
                return 0.0
            raise ValueError("first")
        if solution_str == "second":
            second_failed.set()
            raise ValueError("second")
        return 1.0

    scorer = RewardScorer(ordered, max_workers=3)
    with scorer, pytest.raises(RewardFunctionError) as caught:
        scorer.score(rows("ok", "first", "second"))
    message = str(caught.value)
    assert message.startswith("reward function")
    assert "failed on row 1" in message
    assert "ValueError: first" in message
    assert message.endswith("(1 more of the batch's 3 rows failed too: rows 2)")
    assert str(caught.value.__cause__) == "first"


def test_count_mode_scores_failures_zero_counts_lists_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def mixed(data_source: str, solution_str: str, ground_truth: Any) -> object:
        if solution_str == "raise":
            raise RuntimeError("counted")
        if solution_str == "none":
            return None
        return {"score": 1.0, "acc": 1.0}

    scorer = RewardScorer(mixed, on_error="count")
    with scorer, caplog.at_level(logging.WARNING, logger="sc_trainer.rewards"):
        outcome = scorer.score(rows("ok", "raise", "ok", "none"))
    assert outcome.scores == [1.0, 0.0, 1.0, 0.0]
    assert outcome.failures == 2
    assert outcome.failed_rows == [1, 3]
    assert "raised RuntimeError: counted" in outcome.failure_messages[0]
    assert "returned None" in outcome.failure_messages[1]
    assert outcome.extra["acc"][0] == 1.0
    assert math.isnan(outcome.extra["acc"][1])
    [record] = caplog.records
    assert "failed on 2 of 4 rows (rows 1, 3), each scored 0.0" in record.getMessage()
    assert "RuntimeError: counted" in record.getMessage()


def test_an_unknown_data_source_of_the_default_reward_is_a_failed_row() -> None:
    with RewardScorer(default_compute_score, on_error="count") as scorer:
        outcome = scorer.score(
            [
                RewardInput("openai/gsm8k", "#### 3", "3"),
                RewardInput("hotpotqa", "Paris", "Paris"),
            ]
        )
    assert outcome.scores == [1.0, 0.0]
    assert outcome.failed_rows == [1]
    assert "no rule for data_source 'hotpotqa'" in outcome.failure_messages[0]


# --- scoring: deadlines -------------------------------------------------------------------


def test_a_hung_sync_call_times_out_and_does_not_starve_the_pool(never: threading.Event) -> None:
    def hangs(data_source: str, solution_str: str, ground_truth: Any) -> float:
        if solution_str == "hang":
            never.wait()
        return 1.0

    with RewardScorer(hangs, timeout_s=0.2, max_workers=1) as scorer:
        start = time.monotonic()
        with pytest.raises(RewardFunctionError, match=r"row 0 .*: timed out after 0\.2 s") as err:
            scorer.score(rows("hang"))
        assert time.monotonic() - start < GIVE_UP_BOUND_S
        assert isinstance(err.value.__cause__, TimeoutError)
        assert scorer.leaked_threads == 1
        # the only thread is written off: the next batch gets a new one
        assert scorer.score(rows("a", "b")).scores == [1.0, 1.0]
    with RewardScorer(hangs, timeout_s=0.2, max_workers=1, on_error="count") as scorer:
        outcome = scorer.score(rows("hang", "after"))  # in the same batch, too
        assert outcome.scores == [0.0, 1.0]
        assert outcome.failed_rows == [0]


def test_a_hung_async_call_is_cancelled_at_its_deadline() -> None:
    cancelled = threading.Event()

    async def waits(data_source: str, solution_str: str, ground_truth: Any) -> float:
        if solution_str == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return 1.0

    with RewardScorer(waits, timeout_s=0.2, on_error="count") as scorer:
        start = time.monotonic()
        outcome = scorer.score(rows("ok", "hang"))
        assert time.monotonic() - start < GIVE_UP_BOUND_S
        assert outcome.scores == [1.0, 0.0]
        assert "timed out after 0.2 s" in outcome.failure_messages[0]
        assert cancelled.wait(GIVE_UP_BOUND_S)
        assert scorer.score(rows("ok")).scores == [1.0]


def test_a_timeout_error_the_function_raises_is_not_the_deadline() -> None:
    async def remote(data_source: str, solution_str: str, ground_truth: Any) -> float:
        raise TimeoutError("the judge server did not answer")

    scorer = RewardScorer(remote, timeout_s=GIVE_UP_BOUND_S)
    with scorer, pytest.raises(RewardFunctionError) as caught:
        scorer.score(rows("x"))
    assert "raised TimeoutError: the judge server did not answer" in str(caught.value)
    assert "timed out after" not in str(caught.value)


def test_an_awaitable_returned_by_a_sync_function_keeps_the_deadline() -> None:
    def deferred(
        data_source: str, solution_str: str, ground_truth: Any
    ) -> Coroutine[Any, Any, None]:
        return asyncio.Event().wait()  # type: ignore[return-value]

    scorer = RewardScorer(deferred, timeout_s=0.2)
    with scorer, pytest.raises(RewardFunctionError, match=r"timed out after 0\.2 s"):
        scorer.score(rows("x"))


def test_an_async_function_that_blocks_the_loop_is_given_up_on(
    never: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sc_trainer.rewards._scorer._WATCHDOG_GRACE_S", 0.3)

    async def blocks(data_source: str, solution_str: str, ground_truth: Any) -> float:
        if solution_str == "block":
            never.wait()  # blocks the event loop itself: no deadline can fire
        return 1.0

    with RewardScorer(blocks, timeout_s=0.1, on_error="count") as scorer:
        start = time.monotonic()
        outcome = scorer.score(rows("block"))
        assert time.monotonic() - start < GIVE_UP_BOUND_S
        assert outcome.failed_rows == [0]
        assert "event loop stalled" in outcome.failure_messages[0]
        assert scorer.score(rows("ok")).scores == [1.0]  # on a new loop


# --- the scorer's settings and life -------------------------------------------------------


def answer(data_source: str, solution_str: str, ground_truth: Any) -> float:
    return 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"timeout_s": -1.0}, "timeout_s"),
        ({"timeout_s": math.nan}, "timeout_s"),
        ({"timeout_s": math.inf}, "timeout_s"),
        ({"max_workers": 0}, "max_workers"),
        ({"on_error": "ignore"}, "on_error"),
    ],
)
def test_the_scorer_rejects_bad_settings(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TrainerConfigError, match=match):
        RewardScorer(answer, **kwargs)


def test_the_scorer_rejects_what_cannot_be_a_reward_function() -> None:
    not_callable: Any = 3
    with pytest.raises(RewardNotFoundError, match="is not callable"):
        RewardScorer(not_callable)

    def two(a: str, b: str) -> float:
        return 0.0

    with pytest.raises(RewardNotFoundError, match="cannot be called as a reward function"):
        RewardScorer(two)


def test_labels_and_closing() -> None:
    scorer = RewardScorer(gsm8k_score)
    assert scorer.label == "sc_trainer.rewards.gsm8k_score"
    assert RewardScorer(answer, label="mine").label == "mine"
    assert scorer.score(rows("#### 1")).scores == [0.0]
    scorer.close()
    scorer.close()  # idempotent
    with pytest.raises(TrainerStateError, match="after close"):
        scorer.score(rows("#### 1"))
    with RewardScorer(answer) as inside:
        pass
    with pytest.raises(TrainerStateError):
        inside.score([])


def test_a_scorer_dropped_without_close_stops_its_loop() -> None:
    def loop_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("sc-reward-loop")}

    before = loop_threads()
    scorer = RewardScorer(answer)
    assert scorer.score(rows("x")).scores == [1.0]
    [started] = loop_threads() - before
    del scorer
    gc.collect()
    started.join(GIVE_UP_BOUND_S)
    assert not started.is_alive()


# --- the built-in rule rewards ------------------------------------------------------------


@pytest.mark.parametrize(
    ("solution", "truth", "score"),
    [
        ("so 3 + 4 = 7\n#### 7", "7", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("#### $1,000.00", "1000", 1.0),
        ("#### 72 dollars", 72, 1.0),
        ("#### -5", "-5", 1.0),
        ("#### 5\nlater, again\n#### 6", "6", 1.0),
        ("#### 6", "Natalia sold 48/2 = 24 clips.\n#### 6", 1.0),
        ("#### yes", "yes", 1.0),
        ("#### 7", "72", 0.0),
        ("#### 72abc", "72", 0.0),
        ("#### ", "72", 0.0),
        ("the answer is 72", "72", 0.0),
        ("#### 5\n#### 6", "5", 0.0),
    ],
)
def test_gsm8k_score(solution: str, truth: Any, score: float) -> None:
    assert gsm8k_score("openai/gsm8k", solution, truth) == score


def test_gsm8k_format_score_for_a_present_but_wrong_answer() -> None:
    lenient = functools.partial(gsm8k_score, format_score=0.1)
    assert lenient("gsm8k", "#### 5", "6") == 0.1
    assert lenient("gsm8k", "#### five", "6") == 0.1
    assert lenient("gsm8k", "no marker: 6", "6") == 0.0
    assert lenient("gsm8k", "#### 6", "6") == 1.0


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=-(10**12), max_value=10**12), st.booleans())
def test_gsm8k_matches_any_integer_with_or_without_commas(n: int, commas: bool) -> None:
    written = f"{n:,}" if commas else str(n)
    assert gsm8k_score("gsm8k", f"Reasoning...\n#### {written}", str(n)) == 1.0
    assert gsm8k_score("gsm8k", f"#### {n}", f"{n:,}") == 1.0
    assert gsm8k_score("gsm8k", f"#### {n + 1}", str(n), format_score=0.5) == 0.5


@pytest.mark.parametrize(
    ("solution", "truth", "score"),
    [
        (r"so \boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
        (r"\boxed{\dfrac{1}{2}}", r"\frac12", 0.0),
        (r"\boxed{\dfrac{1}{2}}", r"\tfrac{1}{2}", 1.0),
        (r"\boxed{ \left( 1, 2 \right) }.", "(1,2)", 1.0),
        (r"$\boxed{3.}$", "$3$", 1.0),
        (r"\boxed{1\!000}", "1000", 1.0),
        (r"\boxed{\{1,2\}}", r"\{1, 2\}", 1.0),
        (r"\boxed {x^{2}}", "x^{2}", 1.0),
        (r"\boxed{4} then \boxed{5}", "5", 1.0),
        (r"\boxed{\frac{a}{b}} then \boxed{5", r"\frac{a}{b}", 1.0),
        (r"\boxed{7}", r"The answer is $\boxed{7}$.", 1.0),
        (r"\boxed{arrow}", r"\rightarrow", 0.0),
        (r"\boxed{4}", "5", 0.0),
        (r"\boxed{}", "", 0.0),
        ("4", "4", 0.0),
        (r"\boxed 4", "4", 0.0),
    ],
)
def test_boxed_score(solution: str, truth: str, score: float) -> None:
    assert boxed_score("math", solution, truth) == score


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet="abcxyz0123456789+-=^_()", min_size=1), st.text(alphabet=" \n"))
def test_boxed_matches_its_own_content_whatever_the_spacing(answer: str, space: str) -> None:
    assert boxed_score("math", f"work... \\boxed{{{space}{answer}{space}}}", answer) == 1.0


@pytest.mark.parametrize(
    ("data_source", "solution", "truth"),
    [
        ("openai/gsm8k", "#### 12", "12"),
        ("DigitalLearningGmbH/MATH-lighteval", r"\boxed{12}", "12"),
        ("aime2024", r"\boxed{12}", "12"),
        ("AMC23", r"\boxed{12}", "12"),
        ("my_boxed_set", r"\boxed{12}", "12"),
    ],
)
def test_default_compute_score_picks_the_rule_by_data_source(
    data_source: str, solution: str, truth: str
) -> None:
    assert default_compute_score(data_source, solution, truth) == 1.0
    assert default_compute_score(data_source, solution, "13") == 0.0


def test_default_compute_score_has_no_rule_for_other_sources() -> None:
    with pytest.raises(RewardFunctionError, match="no rule for data_source 'squad'"):
        default_compute_score("squad", "x", "x")


def test_the_builtins_are_plain_callables_for_trl_style_lists() -> None:
    funcs: list[Callable[..., float]] = [gsm8k_score, boxed_score, default_compute_score]
    assert [f("gsm8k", "#### 1", "1") for f in funcs[::2]] == [1.0, 1.0]
    assert funcs[1]("m", r"\boxed{1}", "1") == 1.0
