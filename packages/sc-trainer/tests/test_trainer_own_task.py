"""Training on your own model, data and reward: a parquet dataset in verl's schema, a reward
function by file path, a Hugging Face model folder (a tiny GPT-2 built here), on the
in-process backend. A run writes its resolved config, resumes on exactly the samples an
uninterrupted run sees, stops naming the row when a reward function fails (or counts, when
asked), exports and evaluates its checkpoint, and refuses bad input before any worker
starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from _trainer_own_task import OwnTask, make_own_task, own_config, rows, write_parquet
from sc_trainer import TaskRunner
from sc_trainer.cli import eval_main, export_main
from sc_trainer.config import TrainerConfigError, config_from_document, load_document
from sc_trainer.data import DatasetError, DatasetNotFoundError
from sc_trainer.rewards import RewardFunctionError, RewardNotFoundError
from sc_trainer.runs import CheckpointMismatchError, read_metrics
from sc_trainer.testing import final_weights, metric_differences
from sc_workers import ScWorkersError

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> OwnTask:
    return make_own_task(tmp_path_factory.mktemp("own"))


def _reward(tmp_path: Path, body: str) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(body, encoding="utf-8")
    return str(path)


def test_a_dataset_run_trains_and_writes_its_resolved_config(task: OwnTask, tmp_path: Path) -> None:
    runner = TaskRunner(own_config(task, tmp_path / "run", {"trainer.logger": ["jsonl"]}))
    result = runner.run()
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert [r["step"] for r in result.history if "val/reward" in r] == [0, 2, 4]
    for record in steps:
        assert 0.0 <= record["response_length/mean"] <= record["response_length/max"] <= 4
        assert 0.0 <= record["response_length/clip_ratio"] <= 1.0
        assert record["perf/throughput_tokens_s"] > 0
        assert record["perf/wall_clock_s"] > 0
    # the file the run wrote builds the configuration the run used, unchanged
    written = config_from_document(load_document(tmp_path / "run" / "config.yaml"))
    assert written == runner.config
    # the experiment tracker got every record metrics.jsonl got
    tracked = [json.loads(line) for line in (tmp_path / "run" / "tracking.jsonl").open()]
    assert [r["step"] for r in tracked] == [r["step"] for r in result.history]
    state = json.loads((result.checkpoint / "trainer_state.json").read_text())
    assert state["data"]["position"] == {
        "step": 4,
        "epoch": 0,
        "batch": 3,
        "steps_per_epoch": 25,
        "rows_consumed": 32,
    }
    assert len(state["data"]["fingerprint"]) == 16


def test_a_resumed_run_sees_the_same_samples_and_ends_with_the_same_weights(
    task: OwnTask, tmp_path: Path
) -> None:
    whole = TaskRunner(own_config(task, tmp_path / "whole")).run()
    # the same run stopped after step 2, then continued by itself (resume_mode auto)
    half = {"trainer.total_training_steps": 2, "trainer.resume_mode": "auto"}
    TaskRunner(own_config(task, tmp_path / "split", half)).run()
    rest = {"trainer.resume_mode": "auto"}
    resumed = TaskRunner(own_config(task, tmp_path / "split", rest)).run()
    assert metric_differences(whole.history, resumed.history) == []
    theirs, mine = final_weights(whole.checkpoint), final_weights(resumed.checkpoint)
    assert theirs.keys() == mine.keys()
    assert all(torch.equal(theirs[k], mine[k]) for k in theirs)


def test_a_run_on_other_data_does_not_resume(task: OwnTask, tmp_path: Path) -> None:
    TaskRunner(own_config(task, tmp_path / "run", {"trainer.total_training_steps": 2})).run()
    fewer = write_parquet(tmp_path / "fewer.parquet", rows([str(i) for i in range(100, 290)], "t"))
    changed = {"data.train_files": str(fewer), "trainer.resume_mode": "auto"}
    with pytest.raises(CheckpointMismatchError, match="was trained on other data"):
        TaskRunner(own_config(task, tmp_path / "run", changed)).run()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
            "    raise ValueError('no answer for ' + ground_truth)\n",
            r"failed on row \d+ \(data_source 'digits/reverse'\).*ValueError: no answer for",
        ),
        (
            "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
            "    return 'right'\n",
            r"row \d+ \(data_source 'digits/reverse'\).*returned 'right'.*not a number",
        ),
        (
            "import threading\n"
            "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
            "    threading.Event().wait(60)\n",
            r"row \d+ \(data_source 'digits/reverse'\).*timed out after 0\.5 s",
        ),
    ],
    ids=["raises", "not-a-number", "hangs"],
)
def test_a_failing_reward_function_stops_the_run_naming_the_row(
    task: OwnTask, tmp_path: Path, body: str, expected: str
) -> None:
    settings = {
        "custom_reward_function.path": _reward(tmp_path, body),
        "custom_reward_function.timeout_s": 0.5,
    }
    runner = TaskRunner(own_config(task, tmp_path / "run", settings))
    with pytest.raises(RewardFunctionError, match=expected):
        runner.run()
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert records == [], "no score was recorded: the prologue's validation failed first"


def test_counting_failures_scores_them_zero_and_counts_them(task: OwnTask, tmp_path: Path) -> None:
    body = (
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if ground_truth.endswith('1'):\n"
        "        raise RuntimeError('a flaky checker')\n"
        "    return {'score': 1.0, 'length': float(len(solution_str))}\n"
    )
    settings = {
        "custom_reward_function.path": _reward(tmp_path, body),
        "custom_reward_function.on_error": "count",
    }
    result = TaskRunner(own_config(task, tmp_path / "run", settings)).run()
    steps = [r for r in result.history if "train/reward" in r]
    assert sum(r["reward/failures"] for r in steps) > 0
    assert all(r["reward/failures"] < 16 for r in steps)  # the others scored 1
    assert all("reward/length" in r for r in steps)  # a dict result's extra value


def test_an_async_reward_function(task: OwnTask, tmp_path: Path) -> None:
    body = (
        "import asyncio\n"
        "async def judge(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    await asyncio.sleep(0)\n"
        "    return 1.0 if ''.join(solution_str.split()) == ground_truth else 0.25\n"
    )
    settings = {
        "custom_reward_function.path": _reward(tmp_path, body),
        "custom_reward_function.name": "judge",
        "trainer.total_training_steps": 2,
    }
    result = TaskRunner(own_config(task, tmp_path / "run", settings)).run()
    rewards = [r["train/reward"] for r in result.history if "train/reward" in r]
    assert all(r >= 0.25 for r in rewards), rewards


def test_the_checkpoint_exports_to_hugging_face_and_evaluates(
    task: OwnTask, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transformers: Any = pytest.importorskip("transformers")
    contents = {
        "actor_rollout_ref.actor.checkpoint.save_contents": [
            "model",
            "optimizer",
            "extra",
            "hf_model",
        ]
    }
    result = TaskRunner(own_config(task, tmp_path / "run", contents)).run()
    assert (result.checkpoint / "huggingface" / "config.json").is_file()
    assert export_main([str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    for folder in (result.checkpoint / "huggingface", tmp_path / "hf"):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
        ids = tokenizer("123=", return_tensors="pt", add_special_tokens=False)
        out = model.generate(**ids, max_new_tokens=3, do_sample=False)
        assert out.shape == (1, 7)
    config = tmp_path / "run" / "config.yaml"
    args = [str(tmp_path / "hf"), "--config", str(config), "--k", "3", "--sample"]
    assert eval_main([*args, "--out", str(tmp_path / "eval")]) == 0
    printed = capsys.readouterr().out
    assert "16 prompts, k=3 (sampled)" in printed
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").open()]
    assert len(samples) == 48
    assert results["avg@3"] == pytest.approx(sum(s["score"] for s in samples) / 48)
    by_prompt: dict[int, list[float]] = {}
    for sample in samples:
        by_prompt.setdefault(sample["row_index"], []).append(sample["score"])
    passed = sum(1 for scores in by_prompt.values() if max(scores) >= 1.0) / len(by_prompt)
    assert results["pass@3"] == pytest.approx(passed)


def test_bad_input_is_refused_before_any_worker_starts(task: OwnTask, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(DatasetNotFoundError, match=r"missing\.parquet"):
        TaskRunner(own_config(task, out, {"data.train_files": str(tmp_path / "missing.parquet")}))
    no_prompt = tmp_path / "no_prompt.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "1=", "data_source": "x"}]), no_prompt)
    with pytest.raises(DatasetError, match=r"no_prompt\.parquet.*'prompt'"):
        TaskRunner(own_config(task, out, {"data.train_files": str(no_prompt)}))
    partial = rows([str(i) for i in range(100, 110)], "train")
    partial[3]["reward_model"] = {"style": "rule"}
    without = write_parquet(tmp_path / "partial.parquet", partial)
    with pytest.raises(DatasetError, match=r"ground.truth.*row 3"):
        TaskRunner(own_config(task, out, {"data.train_files": str(without)}))
    with pytest.raises(ScWorkersError, match="is not a local Hugging Face model directory"):
        TaskRunner(own_config(task, out, {"actor_rollout_ref.model.path": str(tmp_path)}))
    missing_reward = {"custom_reward_function.path": str(tmp_path / "nowhere.py")}
    with pytest.raises(RewardNotFoundError, match=r"nowhere\.py"):
        TaskRunner(own_config(task, out, missing_reward))
    with pytest.raises(RewardNotFoundError, match="no_such_function"):
        TaskRunner(own_config(task, out, {"custom_reward_function.name": "no_such_function"}))
    with pytest.raises(TrainerConfigError, match=r"give data\.val_files"):
        own_config(task, out, {"data.val_files": []})
    with pytest.raises(TrainerConfigError, match="give a Hugging Face model"):
        own_config(task, out, {"actor_rollout_ref.model.path": None})
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
