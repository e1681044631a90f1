"""Deadlines: a method that runs past its deadline raises CallTimeoutError.

The slow methods block on an event the test releases, so nothing depends on how fast the
machine is.
"""

from __future__ import annotations

import threading

import pytest
from _core_fakes import group
from sc_core import CallTimeoutError, LazyFuture
from sc_dispatch._setting import SettingValueError


def test_a_call_past_its_deadline_raises_naming_the_pending_ranks() -> None:
    release = threading.Event()
    with group((3,)) as wg:
        with pytest.raises(CallTimeoutError) as info:
            wg.wait_for.options(timeout=0.05)([1], release)
        err = info.value
        assert isinstance(err, TimeoutError)
        assert err.method == "wait_for"
        assert err.timeout == 0.05
        # Rank 1 is blocked and rank 2 waits for its turn after it (rank 0 has normally
        # answered, but a loaded machine may not have run it yet: not asserted).
        assert {1, 2} <= set(err.pending_ranks) <= {0, 1, 2}
        assert list(err.pending_ranks) == sorted(err.pending_ranks)
        assert str(err).startswith("wait_for: no answer from ranks [")
        assert str(err).splitlines()[0].endswith("within the 0.05s timeout")
        # The ranks that still run the abandoned call are named, in the error and the group.
        assert "are still running an abandoned call" in str(err)
        assert "rank 1 (wait_for" in str(err)
        assert {1, 2} <= set(wg.busy_ranks)
        assert wg.busy_ranks[1].method == "wait_for"
        release.set()
        # The group stays usable: the next call runs after the released rank finishes.
        assert wg.wait_for([], release) == [0, 1, 2]
        assert wg.busy_ranks == {}


def test_a_call_that_waits_behind_an_abandoned_one_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    with group((2,)) as wg:
        with pytest.raises(CallTimeoutError):
            wg.wait_for.options(timeout=0.05)([0], release)
        with (
            caplog.at_level("WARNING", logger="sc_core.worker_group"),
            pytest.raises(CallTimeoutError) as info,
        ):
            wg.wait_for.options(timeout=0.05)([], release)
        assert "When this call started, ranks [0, 1] were still running" in str(info.value)
        assert any("waits on ranks [0, 1]" in r.getMessage() for r in caplog.records)
        release.set()
        assert wg.wait_for([], release) == [0, 1]


def test_concurrent_ranks_report_only_the_slow_one() -> None:
    release = threading.Event()
    with group((3,), concurrent=True) as wg:
        with pytest.raises(CallTimeoutError) as info:
            wg.wait_for.options(timeout=0.05)([1], release)
        assert 1 in info.value.pending_ranks
        release.set()


def test_a_call_within_its_deadline_returns() -> None:
    release = threading.Event()
    release.set()
    with group((2,)) as wg:
        assert wg.wait_for.options(timeout=60)([0], release) == [0, 1]


def test_default_timeout_of_the_group_and_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    with group((2,), default_timeout=0.05) as wg:
        assert wg.default_timeout == 0.05
        with pytest.raises(CallTimeoutError):
            wg.wait_for([0], release)
        release.set()
        assert wg.wait_for.options(timeout=60)([], release) == [0, 1]  # per-call override
    release = threading.Event()
    with group((2,), default_timeout=0.05) as wg:
        timer = threading.Timer(0.2, release.set)
        timer.start()
        # Explicitly no deadline: waits for the release however long it takes.
        assert wg.wait_for.options(timeout=None)([0], release) == [0, 1]
        timer.join()
    monkeypatch.setenv("SC_CORE_CALL_TIMEOUT_S", "0.05")
    release = threading.Event()
    with group((1,)) as wg:
        assert wg.default_timeout == 0.05
        with pytest.raises(CallTimeoutError):
            wg.wait_for([0], release)
        release.set()
    for bad in ("soon", "-1"):
        monkeypatch.setenv("SC_CORE_CALL_TIMEOUT_S", bad)
        with pytest.raises(SettingValueError, match="SC_CORE_CALL_TIMEOUT_S"), group((1,)):
            pass  # pragma: no cover


def test_execute_all_sync_uses_the_default_timeout() -> None:
    release = threading.Event()
    with (
        group((2,), default_timeout=0.05) as wg,
        pytest.raises(CallTimeoutError, match="wait_for"),
    ):
        wg.execute_all_sync("wait_for", [1], release)
    release.set()


def test_non_blocking_call_times_out_when_its_future_is_read() -> None:
    release = threading.Event()
    with group((2,)) as wg:
        futs = wg.wait_for.options(blocking=False, timeout=0.05)([0], release)
        assert all(isinstance(f, LazyFuture) for f in futs)
        with pytest.raises(CallTimeoutError, match=r"rank 0"):
            futs[0].get()
        release.set()
        assert wg.wait_for([], release) == [0, 1]
