"""A user's own task for sc-trainer's tests: a small parquet dataset in verl's schema (three
digits reversed), a reward file, and a tiny GPT-2 built here, as a user arrives with them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sc_trainer import TrainerConfig
from sc_trainer.config import config_from_document
from sc_trainer.tasks import save_tiny_gpt2

REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = "".join(solution_str.split())
    right = sum(1 for a, b in zip(answer, ground_truth, strict=False) if a == b)
    return right / len(ground_truth)
"""


@dataclass(frozen=True)
class OwnTask:
    """The files of the task: the model folder, the data files, the reward file."""

    model: Path
    train: Path
    val: Path
    reward: Path


def rows(strings: list[str], split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": "digits/reverse",
            "prompt": f"{s}=",
            "ability": "reverse",
            "reward_model": {"style": "rule", "ground_truth": s[::-1]},
            "extra_info": {"split": split, "index": i},
        }
        for i, s in enumerate(strings)
    ]


def write_parquet(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def make_own_task(root: Path) -> OwnTask:
    """The three-digit strings from 100 to 299 to train on, 16 others held out."""
    strings = [str(i) for i in range(100, 300)]
    held = [str(i) for i in range(900, 916)]
    model = Path(save_tiny_gpt2(root / "model", seed=0))
    reward = root / "reward.py"
    reward.write_text(REWARD, encoding="utf-8")
    return OwnTask(
        model,
        write_parquet(root / "data" / "train.parquet", rows(strings, "train")),
        write_parquet(root / "data" / "val.parquet", rows(held, "val")),
        reward,
    )


def own_document(
    task: OwnTask, output: Path, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The dotted keys of a short run of ``task`` on the in-process backend."""
    document: dict[str, Any] = {
        "data.train_files": str(task.train),
        "data.val_files": str(task.val),
        "data.max_prompt_length": 5,
        "data.max_response_length": 4,
        "data.train_batch_size": 8,
        "actor_rollout_ref.model.path": str(task.model),
        "actor_rollout_ref.rollout.n": 2,
        "custom_reward_function.path": str(task.reward),
        "trainer.backend": "local",
        "trainer.n_gpus_per_node": 1,
        "trainer.total_training_steps": 4,
        "trainer.test_freq": 2,
        "trainer.save_freq": 2,
        "trainer.default_local_dir": str(output),
        "trainer.logger": [],
    }
    document.update(overrides or {})
    return document


def own_config(
    task: OwnTask, output: Path, overrides: dict[str, Any] | None = None
) -> TrainerConfig:
    return config_from_document(own_document(task, output, overrides))
