"""The experiment trackers of ``sc_trainer.loggers``: each backend receives the step metrics,
read back from what it wrote (TensorBoard's event files, the offline W&B run's ``.wandb``
file, MLflow's local file store); the console writes a line per step; wrong names and
missing extras fail before anything is built; a failing tracker is not swallowed.

The backends are extras: the nox session tests(sc-trainer) installs them (and a missing one
fails there); elsewhere a test whose backend is missing is skipped.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import re
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from sc_trainer import ScTrainerError, TrainerConfigError
from sc_trainer.loggers import (
    TRACKER_NAMES,
    MissingExtraError,
    Tracker,
    Tracking,
    make_trackers,
)
from sc_trainer.loggers._console import format_line
from sc_trainer.loggers._mlflow import MAX_PARAM_VALUE, flat_params, mlflow_key
from sc_trainer.loggers._values import scalar_metrics
from sc_trainer.trainer import TrainerStateError

pytestmark = pytest.mark.timeout(120)

STEPS = (1, 2, 3)
#: the run configuration the W&B and MLflow runs record
CONFIG: dict[str, Any] = {
    "trainer": {"steps": 3, "lr": 0.001},
    "model": {"path": Path("/models/tiny")},
    "tags": ["a", "b"],
    "prompt": "p" * 7000,  # longer than an MLflow parameter
}


def record(step: int) -> dict[str, Any]:
    """One step's metrics as the trainer makes them, with values no tracker records."""
    return {
        "step": step,
        "train/reward": 0.5 * step,
        "actor/pg_loss": -0.25 * step,
        "timing/gen[0]": 1.5,  # not a valid MLflow name as it is
        "rollout/regenerated_rows": step,  # an int
        "agent/flag": step % 2 == 1,  # a bool: 0/1
        "val/reward": None,  # a non-finite value, as the trainer writes it
        "actor/entropy": math.nan,
        "note": "text",
        "lengths": [1, 2, 3],
    }


#: what every tracker records of ``record(step)``
RECORDED = {
    "train/reward",
    "actor/pg_loss",
    "timing/gen[0]",
    "rollout/regenerated_rows",
    "agent/flag",
}


def expected(step: int) -> dict[str, float]:
    return {k: float(v) for k, v in record(step).items() if k in RECORDED}


def run_steps(tracking: Tracking) -> None:
    with tracking:
        for step in STEPS:
            tracking.log(record(step), step)


def start(names: list[str], output_dir: Path) -> Tracking:
    return make_trackers(
        names, output_dir, project_name="sc-proj", experiment_name="exp-1", config=CONFIG
    )


def need_backend(module: str) -> None:
    """Import ``module`` (a tracker's extra): in tests(sc-trainer), which installs the
    extras, a missing one fails; elsewhere it skips the test."""
    if os.environ.get("SC_ISOLATED_PACKAGE") == "sc-trainer":
        importlib.import_module(module)
    else:
        pytest.importorskip(module)


@pytest.fixture(autouse=True)
def _backend_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts without the backends' variables, and gets back what it had: the
    trackers set some of them with ``os.environ.setdefault``."""
    for name in (
        "WANDB_MODE",
        "WANDB_DIR",
        "WANDB_ERROR_REPORTING",
        "MLFLOW_TRACKING_URI",
        "MLFLOW_ALLOW_FILE_STORE",
        "MLFLOW_DISABLE_TELEMETRY",
    ):
        monkeypatch.delenv(name, raising=False)


# --- which values count ----------------------------------------------------------------------


def test_only_finite_numbers_are_recorded_bools_as_0_or_1() -> None:
    numbers = scalar_metrics(record(3))
    assert numbers == expected(3)
    assert numbers["agent/flag"] == 1
    assert isinstance(numbers["agent/flag"], int)
    assert scalar_metrics({"step": 4, "x": math.inf, "y": False, "z": {"a": 1}}) == {"y": 0}


def test_importing_the_trackers_imports_no_backend() -> None:
    code = (
        "import sys, sc_trainer.loggers; "
        "print(sorted(m for m in ('tensorboard', 'wandb', 'mlflow') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


# --- console -----------------------------------------------------------------------------------


def test_console_writes_one_readable_line_per_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_steps(start(["console"], tmp_path))
    lines = capsys.readouterr().out.splitlines()
    assert lines == [format_line(record(step), step) for step in STEPS]
    assert lines[0] == "step 1 | train/reward 0.5 | actor/pg_loss -0.25"
    assert lines[2] == "step 3 | train/reward 1.5 | actor/pg_loss -0.75"
    # a step without the main metrics shows all its numbers, rounded
    assert format_line({"a/x": 1 / 3, "b": 7, "c": "no"}, 9) == "step 9 | a/x 0.3333 | b 7"
    assert not list(tmp_path.iterdir())  # the console writes no file


# --- jsonl -------------------------------------------------------------------------------------


def test_jsonl_writes_the_numbers_of_each_step_and_leaves_metrics_jsonl_alone(
    tmp_path: Path,
) -> None:
    run_steps(start(["jsonl"], tmp_path))
    lines = (tmp_path / "tracking.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": step, **expected(step)} for step in STEPS
    ]
    assert not (tmp_path / "metrics.jsonl").exists()


# --- TensorBoard -------------------------------------------------------------------------------


def test_tensorboard_event_files_hold_every_step(tmp_path: Path) -> None:
    need_backend("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_steps(start(["tensorboard"], tmp_path))
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == RECORDED
    for name in RECORDED:
        got = [(e.step, e.value) for e in events.Scalars(name)]
        assert [s for s, _ in got] == list(STEPS), name
        assert [v for _, v in got] == pytest.approx([expected(s)[name] for s in STEPS]), name


# --- W&B ---------------------------------------------------------------------------------------


def wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a ``.wandb`` file: a 7-byte header (``:W&B``, magic, version), then
    LevelDB's log format, blocks of 32 KiB holding chunks (checksum, length, type: full,
    first, middle, last) of protobuf ``Record`` messages."""
    data = path.read_bytes()
    if len(data) < 7:  # the service has not written the header yet
        return
    assert data[:4] == b":W&B"
    block, pos, pending = 32 * 1024, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # the zero padding of a block
            pos += left
            continue
        if pos + 7 + length > len(data):  # a chunk the service is still writing
            return
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, or last
            yield pending
            pending = b""


def finished_wandb_run(run_file: Path, record_type: type[Any]) -> list[Any]:
    """The records of an offline W&B run, once it holds the run's exit record: W&B's service
    writes the last records when it closes the run's stream, just after ``finish`` returns
    (or when the process exits)."""
    deadline = time.monotonic() + 60
    while True:
        records = [record_type.FromString(raw) for raw in wandb_records(run_file)]
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{run_file} has no exit record after 60 s"
        time.sleep(0.2)


def _wandb_value(item: Any) -> tuple[str, Any]:
    key = "/".join(item.nested_key) if item.nested_key else item.key
    return key, json.loads(item.value_json)


def test_wandb_offline_run_holds_every_step_and_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    need_backend("wandb")
    # the protobuf module of the installed protobuf's version, chosen when it is imported
    record_type = importlib.import_module("wandb.proto.wandb_internal_pb2").Record

    run_steps(start(["wandb"], tmp_path))
    assert capsys.readouterr().out == ""  # W&B writes nothing on standard output
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    (run_file,) = run_dir.glob("run-*.wandb")

    history: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    config: dict[str, Any] = {}
    runs = []
    for rec in finished_wandb_run(run_file, record_type):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append(dict(_wandb_value(i) for i in rec.history.item))
        elif kind == "summary":
            summary.update(_wandb_value(i) for i in rec.summary.update)
        elif kind == "run":
            runs.append(rec.run)
            config.update(_wandb_value(i) for i in rec.run.config.update)
        elif kind == "config":
            config.update(_wandb_value(i) for i in rec.config.update)

    (run,) = runs
    assert (run.project, run.display_name) == ("sc-proj", "exp-1")
    assert config["trainer"] == {"steps": 3, "lr": 0.001}
    assert config["model"] == {"path": "/models/tiny"}
    assert config["tags"] == ["a", "b"]
    assert config["prompt"] == "p" * 7000
    assert [h["_step"] for h in history] == list(STEPS)
    for step, row in zip(STEPS, history, strict=True):
        assert {k: v for k, v in row.items() if not k.startswith("_")} == pytest.approx(
            expected(step)
        )
    assert summary["train/reward"] == pytest.approx(1.5)
    assert summary["_step"] == 3
    assert "val/reward" not in summary
    assert "note" not in summary


# --- MLflow ------------------------------------------------------------------------------------


def test_mlflow_local_store_holds_every_step_and_the_params(tmp_path: Path) -> None:
    need_backend("mlflow")
    from mlflow.tracking import MlflowClient

    run_steps(start(["mlflow"], tmp_path))
    store = tmp_path / "mlruns"
    assert store.is_dir()
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    experiment = client.get_experiment_by_name("sc-proj")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "exp-1"
    assert run.info.status == "FINISHED"
    assert run.data.params == {
        "trainer.steps": "3",
        "trainer.lr": "0.001",
        "model.path": "/models/tiny",
        "tags": "['a', 'b']",
        "prompt": "p" * MAX_PARAM_VALUE,
    }
    keys = {mlflow_key(name): name for name in RECORDED}
    assert keys["timing/gen_0_"] == "timing/gen[0]"
    assert set(run.data.metrics) == set(keys)
    for key, name in keys.items():
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == list(STEPS), key
        assert [m.value for m in history] == pytest.approx([expected(s)[name] for s in STEPS])


def test_mlflow_keys_and_params_fit_mlflow_limits() -> None:
    assert mlflow_key("train/reward") == "train/reward"
    assert mlflow_key("perf/tokens per s-1.0") == "perf/tokens per s-1.0"
    assert mlflow_key("a:b/c[0]{x}") == "a_b/c_0__x_"
    assert mlflow_key("/a//./b/../c/") == "a/b/c"
    assert mlflow_key("é") == "_"
    assert mlflow_key("") == "_"
    assert len(mlflow_key("x" * 300)) == 250
    params = flat_params({"a": {"b": {"c": 1}}, "long": "y" * 7000, "bad key!": None, "e": {}})
    assert params == {"a.b.c": "1", "long": "y" * MAX_PARAM_VALUE, "bad key_": "None", "e": "{}"}


# --- names and extras --------------------------------------------------------------------------


def test_the_known_names() -> None:
    assert TRACKER_NAMES == ("console", "jsonl", "tensorboard", "wandb", "mlflow")
    tracking = start([], Path("unused"))
    assert tracking.names == ()
    tracking.log(record(1), 1)  # no tracker: nothing to do
    tracking.close()


@pytest.mark.parametrize(
    ("name", "nearest"), [("tensorbord", "tensorboard"), ("Wandb", "wandb"), ("mlfow", "mlflow")]
)
def test_an_unknown_name_names_the_nearest_and_lists_all(
    tmp_path: Path, name: str, nearest: str
) -> None:
    with pytest.raises(TrainerConfigError, match=f"did you mean '{nearest}'") as info:
        start(["console", name], tmp_path)
    assert repr(name) in str(info.value)
    assert "console, jsonl, tensorboard, wandb, mlflow" in str(info.value)
    with pytest.raises(TrainerConfigError, match="unknown tracker 'slack'") as far:
        start(["slack"], tmp_path)
    assert "did you mean" not in str(far.value)


def test_a_name_twice_a_bare_string_or_an_empty_project_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TrainerConfigError, match="'console' is named twice"):
        start(["console", "jsonl", "console"], tmp_path)
    with pytest.raises(TrainerConfigError, match=re.escape("did you mean ['console']")):
        start("console", tmp_path)  # type: ignore[arg-type]  # a string is a sequence, wrongly
    with pytest.raises(TrainerConfigError, match="project_name must be a non-empty string"):
        make_trackers(["jsonl"], tmp_path, project_name=" ", experiment_name="e", config={})
    assert not (tmp_path / "tracking.jsonl").exists()


@pytest.mark.parametrize("extra", ["tensorboard", "wandb", "mlflow"])
def test_a_missing_extra_fails_before_any_tracker_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, extra, None)  # `import <extra>` raises ImportError
    with pytest.raises(MissingExtraError, match=re.escape(f"pip install 'sc-trainer[{extra}]'")):
        start(["jsonl", extra], tmp_path)
    assert not (tmp_path / "tracking.jsonl").exists()  # jsonl, listed first, never started
    assert issubclass(MissingExtraError, ImportError)
    assert issubclass(MissingExtraError, ScTrainerError)


# --- failures of the trackers ------------------------------------------------------------------


class Recorder:
    """A tracker that keeps what it gets, and may fail to log or to close."""

    def __init__(self, fail_log: bool = False, fail_close: bool = False) -> None:
        self.steps: list[int] = []
        self.closed = 0
        self.fail_log = fail_log
        self.fail_close = fail_close

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self.fail_log:
            raise OSError(f"disk full at step {step}")
        self.steps.append(step)

    def close(self) -> None:
        self.closed += 1
        if self.fail_close:
            raise RuntimeError("cannot close")


def test_the_trackers_keep_the_protocol(tmp_path: Path) -> None:
    recorder: Tracker = Recorder()
    assert isinstance(recorder, Tracker)
    with start(["console", "jsonl"], tmp_path) as tracking:
        assert tracking.names == ("console", "jsonl")
        assert all(isinstance(t, Tracker) for t in tracking.trackers.values())


def test_a_tracker_failing_to_log_stops_the_run_after_the_others_got_the_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before, failing, after = Recorder(), Recorder(fail_log=True), Recorder()
    tracking = Tracking({"before": before, "failing": failing, "after": after})
    with (
        caplog.at_level(logging.ERROR, logger="sc_trainer.loggers"),
        pytest.raises(OSError, match="disk full at step 7"),
    ):
        tracking.log({"x": 1.0}, 7)
    assert before.steps == after.steps == [7]
    assert "tracker 'failing' failed to log step 7" in caplog.text
    tracking.close()
    assert before.closed == failing.closed == after.closed == 1


def test_close_closes_every_tracker_then_raises_the_first_failure() -> None:
    trackers = [Recorder(), Recorder(fail_close=True), Recorder(fail_close=True), Recorder()]
    tracking = Tracking({f"t{i}": t for i, t in enumerate(trackers)})
    with pytest.raises(RuntimeError, match="cannot close"):
        tracking.close()
    assert [t.closed for t in trackers] == [1, 1, 1, 1]
    assert tracking.closed
    tracking.close()  # closed once only
    assert [t.closed for t in trackers] == [1, 1, 1, 1]
    with pytest.raises(TrainerStateError, match="after close"):
        tracking.log({"x": 1.0}, 1)
