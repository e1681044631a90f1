"""Call spans: phases, observers, the Chrome trace and the per-method summary."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _core_fakes import Batch, group
from sc_core import CallSpan, InvalidConfigError, SpanRecorder, WorkerError, driver_span
from sc_core.ext import add_span_observer, remove_span_observer


def test_a_blocking_call_records_one_span_per_phase(tmp_path: Path) -> None:
    with group((2,), name_prefix="trace") as wg, SpanRecorder() as rec:
        wg.shard_rows(Batch(range(4)))
    (span,) = rec.spans
    assert span.group == "trace"
    assert span.method == "shard_rows"
    assert span.ranks == (0, 1)
    assert span.blocking is True
    assert span.error is None
    assert span.end is not None
    assert span.end >= span.start
    driver = [p.name for p in span.phases if p.rank is None]
    assert driver == ["dispatch", "execute", "wait", "collect"]
    assert sorted(p.rank for p in span.phases if p.rank is not None) == [0, 1]

    path = rec.write_chrome_trace(tmp_path / "trace.json")
    events = json.loads(path.read_text())["traceEvents"]
    assert sorted(e["cat"] for e in events if e["tid"] == "driver") == sorted(
        ["dispatch", "execute", "wait", "collect"]
    )
    assert {e["tid"] for e in events} == {"driver", "rank 0", "rank 1"}
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)
    assert all(e["name"].startswith("shard_rows:") for e in events)


def test_a_driver_span_wraps_the_calls_it_makes() -> None:
    with (
        group((2,), name_prefix="op") as wg,
        SpanRecorder() as rec,
        driver_span("op", "two_calls") as outer,
    ):
        wg.shard_rows(Batch(range(4)))
        wg.shard_rows(Batch(range(2)))
        outer.add_bytes(fetched=7)
    calls = [s for s in rec.spans if s.method == "shard_rows"]
    (op,) = [s for s in rec.spans if s.method == "two_calls"]
    assert len(calls) == 2
    assert [p.name for p in op.phases] == ["run"]
    assert op.group == "op"
    assert op.bytes_fetched == 7
    assert op.error is None
    assert op.end is not None
    assert op.start <= min(c.start for c in calls)
    assert op.end >= max(c.end or 0 for c in calls)
    entry = rec.summary()["op.two_calls"]
    assert entry["calls"] == 1
    assert entry["phases"]["run"].count == 1
    events = [e for e in rec.trace_events() if e["args"]["call_id"] == op.call_id]
    assert [e["name"] for e in events] == ["two_calls:run"]


def test_a_driver_span_records_the_error_and_reraises() -> None:
    with SpanRecorder() as rec, pytest.raises(KeyError, match="lost"), driver_span("op", "fails"):
        raise KeyError("lost")
    (op,) = rec.spans
    assert op.error == "KeyError: 'lost'"
    assert [p.name for p in op.phases] == ["run"]


def test_a_driver_span_records_nothing_unobserved_and_checks_its_names() -> None:
    with driver_span("op", "quiet") as span:
        assert span.recording is False
    bad = pytest.raises(InvalidConfigError, match=r"driver_span: group and name .* got '', 'x'")
    with bad, driver_span("", "x"):
        pass


def test_a_non_blocking_call_has_no_wait_phase() -> None:
    with group((2,)) as wg, SpanRecorder() as rec:
        wg.later(1)
    (span,) = rec.spans
    assert [p.name for p in span.phases if p.rank is None] == ["dispatch", "execute", "collect"]
    assert span.blocking is False


def test_a_failed_call_records_its_error() -> None:
    with group((2,)) as wg, SpanRecorder() as rec, pytest.raises(WorkerError):
        wg.fail_on([1])
    (span,) = rec.spans
    assert span.error is not None
    assert span.error.startswith("WorkerError[ValueError]: fail_on failed on rank 1")
    assert rec.summary()[f"{wg.name_prefix}.fail_on"]["errors"] == 1


def test_summary_counts_calls_and_gives_percentiles() -> None:
    with group((2,), name_prefix="sum") as wg, SpanRecorder() as rec:
        for _ in range(5):
            wg.one_to_all(0)
        wg.rank_zero(0)
    summary = rec.summary()
    entry = summary["sum.one_to_all"]
    assert entry["calls"] == 5
    assert entry["errors"] == 0
    assert set(entry["phases"]) == {"dispatch", "execute", "wait", "collect", "worker"}
    stats = entry["phases"]["wait"]
    assert stats.count == 5
    assert 0 <= stats.p50 <= stats.p95 <= stats.max <= stats.total
    assert summary["sum.rank_zero"]["calls"] == 1
    text = rec.format_summary()
    assert "sum.one_to_all" in text
    assert "p95 ms" in text


def test_observers_are_added_and_removed() -> None:
    seen: list[CallSpan] = []
    remove = add_span_observer(seen.append)
    with group((1,)) as wg:
        wg.one_to_all(0)
        remove()
        wg.one_to_all(0)
    assert len(seen) == 1
    remove_span_observer(seen.append)  # removing twice is fine
    with pytest.raises(InvalidConfigError, match="observer must be callable"):
        add_span_observer("nope")  # type: ignore[arg-type]


def test_a_failing_observer_is_logged_and_does_not_break_the_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def bad(span: CallSpan) -> None:
        raise RuntimeError("observer broke")

    remove = add_span_observer(bad)
    try:
        with group((1,)) as wg, caplog.at_level(logging.ERROR, logger="sc_core.spans"):
            assert wg.one_to_all(3) == [(0, 3, None)]
    finally:
        remove()
    assert "span observer" in caplog.text


def test_recorder_bounds_memory_and_clears() -> None:
    rec = SpanRecorder(max_spans=2)
    with group((1,)) as wg, rec:
        for value in range(4):
            wg.one_to_all(value)
    assert len(rec.spans) == 2
    assert rec.spans[0].call_id < rec.spans[1].call_id
    rec.clear()
    assert rec.spans == []
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidConfigError, match="max_spans"):
            SpanRecorder(max_spans=bad)  # type: ignore[arg-type]


def test_span_helpers() -> None:
    span = CallSpan(group="g", method="m", blocking=True, ranks=(0,))
    assert span.duration("dispatch") is None
    span.add_phase("dispatch", 1.0, 1.5)
    span.add_phase("dispatch", 2.0, 2.25)
    span.add_phase("execute", 1.0, 9.0, rank=0)
    assert span.duration("dispatch") == 0.75
    assert span.duration("execute") is None  # per-rank records are not driver time
    span.add_bytes(put=3)
    span.add_bytes(fetched=4)
    assert (span.bytes_put, span.bytes_fetched) == (3, 4)


def test_sc_trace_file_writes_a_trace_at_exit(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    script = (
        "from sc_core import ClassWithInitArgs, LocalWorkerGroup, ResourcePool, Worker\n"
        "from sc_dispatch import Dispatch, register\n"
        "class W(Worker):\n"
        "    @register(dispatch_mode=Dispatch.ONE_TO_ALL)\n"
        "    def f(self): return self.rank\n"
        "wg = LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(W))\n"
        "assert wg.f() == [0, 1]\n"
    )
    env = dict(os.environ, SC_CORE_TRACE_FILE=str(out))
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    events = json.loads(out.read_text())["traceEvents"]
    assert {e["cat"] for e in events} == {"dispatch", "execute", "wait", "collect"}
