"""The examples run as their guide says, from a copy of their folder: ``python prepare.py``,
``sc-train --config config.yaml`` (shortened to two steps on the in-process backend), then
``sc-eval`` and ``sc-export`` on the run's output folder; the exported folder loads with
``transformers.AutoModelForCausalLM`` and generates. How far each learns is measured by
``integration/benchmarks/own_task_curve.py``, not here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent
SHORT = [
    "trainer.total_training_steps=2",
    "trainer.test_freq=2",
    "trainer.save_freq=2",
    "trainer.backend=local",
    "trainer.n_gpus_per_node=1",
]

pytestmark = pytest.mark.timeout(600)


def _run(args: list[str], cwd: Path) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=540, check=False)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("name", ["digits", pytest.param("max_digit", marks=pytest.mark.extended)])
def test_an_example_runs_as_its_guide_says(name: str, tmp_path: Path) -> None:
    folder = tmp_path / name
    shutil.copytree(
        EXAMPLES / name, folder, ignore=shutil.ignore_patterns("data", "model", "output", "hf")
    )
    _run([sys.executable, "prepare.py"], folder)
    trained = _run([str(BIN / "sc-train"), "--config", "config.yaml", *SHORT], folder)
    assert "sc-train: 2 steps" in trained
    evaluated = _run(
        [
            str(BIN / "sc-eval"),
            "output",
            "--config",
            "config.yaml",
            "--k",
            "2",
            "--sample",
            "--out",
            "eval",
        ],
        folder,
    )
    assert "pass@2" in evaluated
    results = json.loads((folder / "eval" / "results.json").read_text())
    lines = (folder / "eval" / "samples.jsonl").read_text().splitlines()
    scores = [json.loads(line)["score"] for line in lines]
    assert len(scores) == 2 * results["prompts"]
    assert results["avg@2"] == pytest.approx(sum(scores) / len(scores))
    _run([str(BIN / "sc-export"), "output", "hf"], folder)
    transformers: Any = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder / "hf"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder / "hf"))
    ids = tokenizer("123=", return_tensors="pt", add_special_tokens=False)
    assert model.generate(**ids, max_new_tokens=2, do_sample=False).shape[1] == 6
