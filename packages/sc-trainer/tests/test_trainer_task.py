"""The toy task, its tokenizer, the dp balancing and the output folder (no workers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_trainer import RunOutput, TaskConfig, TrainerConfigError
from sc_trainer.config import TaskError
from sc_trainer.runs import CheckpointNotFoundError, read_metrics, resolve_checkpoint
from sc_trainer.tasks import CharTokenizer, DigitsTask
from sc_trainer.trainer import balanced_order, shard_token_sums

settings.register_profile("sc-trainer", deadline=None, max_examples=50)
settings.load_profile("sc-trainer")


def test_tokenizer_round_trip_and_specials() -> None:
    tok = CharTokenizer("0123456789=")
    assert tok.vocab_size == 14
    ids = tok.encode("0123=")
    assert ids == [3, 4, 5, 6, 13]
    assert tok.decode([tok.bos_token_id, *ids, tok.eos_token_id]) == "0123="
    assert tok.decode([1, 3], skip_special=False) == "<bos>0"


@pytest.mark.parametrize("alphabet", ["", "aa"])
def test_tokenizer_rejects_bad_alphabet(alphabet: str) -> None:
    with pytest.raises(TaskError, match="alphabet"):
        CharTokenizer(alphabet)


def test_tokenizer_rejects_unknown_character_and_id() -> None:
    tok = CharTokenizer("01")
    with pytest.raises(TaskError, match="'x'"):
        tok.encode("0x")
    with pytest.raises(TaskError, match="id 9"):
        tok.decode([9])


def test_split_is_disjoint_complete_and_fixed() -> None:
    task = DigitsTask(TaskConfig(length=3, num_val=100))
    train, val = set(task.train_strings), set(task.val_strings)
    assert len(val) == 100
    assert not train & val
    assert len(train | val) == 1000
    again = DigitsTask(TaskConfig(length=3, num_val=100))
    assert list(again.val_strings) == list(task.val_strings)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"length": 0}, "length"), ({"length": 6}, "length"), ({"length": 2, "num_val": 51}, "50")],
)
def test_task_config_rejects_out_of_range(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TaskError, match=match):
        TaskConfig(**kwargs)


def test_sampling_depends_only_on_seed_and_step() -> None:
    task = DigitsTask(TaskConfig(length=3, num_val=100))
    a = task.sample_train(16, seed=3, step=7)
    assert list(a) == list(task.sample_train(16, seed=3, step=7))
    assert list(a) != list(task.sample_train(16, seed=3, step=8))
    assert len(set(a)) == 16
    assert set(a) <= set(task.train_strings)
    with pytest.raises(TaskError, match="got 0"):
        task.sample_train(0, seed=0, step=0)


def test_prompts_encode_to_fixed_shape() -> None:
    task = DigitsTask(TaskConfig(length=3, num_val=100))
    enc = task.encode_prompts(["012", "987"])
    assert enc["input_ids"].shape == (2, task.prompt_length)
    assert enc["input_ids"][0].tolist() == [1, 3, 4, 5, 13]
    assert enc["attention_mask"].sum().item() == 2 * task.prompt_length
    assert enc["position_ids"][1].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(TaskError, match="'12'"):
        task.encode_prompts(["12"])
    with pytest.raises(TaskError, match="no prompts"):
        task.encode_prompts([])


def test_score_gives_partial_credit_per_position() -> None:
    task = DigitsTask(TaskConfig(length=3, num_val=100))
    tok = task.tokenizer
    responses = torch.tensor([tok.encode("210"), tok.encode("200"), tok.encode("999")])
    scores = task.score(["012", "012", "012"], responses)
    assert scores.tolist() == pytest.approx([1.0, 2 / 3, 0.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    assert task.score(["012"] * 3, responses, mask)[0].item() == pytest.approx(2 / 3)


def test_score_rejects_bad_shapes() -> None:
    task = DigitsTask(TaskConfig(length=3, num_val=100))
    with pytest.raises(TaskError, match=r"\[2, R\]"):
        task.score(["012", "345"], torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(TaskError, match="2 tokens"):
        task.score(["012"], torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(TaskError, match="response_mask shape"):
        task.score(["012"], torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 4))


def test_random_policy_scores_low_but_not_zero() -> None:
    task = DigitsTask()
    gen = torch.Generator().manual_seed(0)
    texts = task.val_strings
    responses = torch.randint(
        0, task.tokenizer.vocab_size, (len(texts), task.response_length), generator=gen
    )
    mean = task.score(texts, responses).mean().item()
    assert 0.02 < mean < 0.15


@given(
    counts=st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=64),
    dp=st.integers(min_value=1, max_value=8),
)
def test_balanced_order_is_a_permutation_no_worse_than_the_original(
    counts: list[int], dp: int
) -> None:
    if len(counts) < dp:
        with pytest.raises(TrainerConfigError, match=f"{len(counts)} rows"):
            balanced_order(counts, dp)
        return
    order = balanced_order(counts, dp)
    assert sorted(order) == list(range(len(counts)))
    reordered = [counts[i] for i in order]
    balanced = shard_token_sums(reordered, dp)
    assert sum(balanced) == sum(counts)
    # greedy longest-first is within the largest row of the best possible max shard
    assert max(balanced) <= sum(counts) / dp + max(counts) + 1e-9 or dp == 1


def test_balanced_order_evens_out_sorted_lengths() -> None:
    counts = [10, 10, 10, 10, 1, 1, 1, 1]
    assert shard_token_sums(counts, 2) == [40, 4]
    order = balanced_order(counts, 2)
    assert shard_token_sums([counts[i] for i in order], 2) == [22, 22]


def test_balanced_order_rejects_bad_input() -> None:
    with pytest.raises(TrainerConfigError, match="dp_size must be >= 1, got 0"):
        balanced_order([1, 2], 0)
    with pytest.raises(TrainerConfigError, match="-1"):
        balanced_order([1, -1], 1)
    with pytest.raises(TrainerConfigError, match="got 0"):
        shard_token_sums([1], 0)


def test_output_folder_metrics_checkpoint_and_plot(tmp_path: Path) -> None:
    out = RunOutput(tmp_path / "run")
    out.start([{"step": 1, "train/reward": 0.1}])
    out.log_metrics({"step": 2, "train/reward": torch.tensor(0.5), "actor/kl_ref": float("nan")})
    records = read_metrics(out.metrics_path)
    assert records == [
        {"step": 1, "train/reward": 0.1},
        {"step": 2, "train/reward": 0.5, "actor/kl_ref": None},
    ]
    folder = out.finish_checkpoint(2, {"global_step": 2})
    assert resolve_checkpoint(out.root) == folder
    assert resolve_checkpoint(out.checkpoint_root) == folder
    assert resolve_checkpoint(folder) == folder
    assert read_metrics(folder / "metrics.jsonl") == records
    assert json.loads((folder / "trainer_state.json").read_text())["global_step"] == 2
    png = out.write_plot()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resolve_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="neither a checkpoint folder"):
        resolve_checkpoint(tmp_path)
    out = RunOutput(tmp_path / "run")
    (out.checkpoint_root / "latest").write_text("7\n")
    with pytest.raises(CheckpointNotFoundError, match="step '7'"):
        resolve_checkpoint(out.root)


def test_copy_mode_and_token_scores() -> None:
    task = DigitsTask(TaskConfig(length=3, num_val=100, mode="copy"))
    tok = task.tokenizer
    responses = torch.tensor([[*tok.encode("01"), tok.eos_token_id, tok.pad_token_id]])
    per_token = task.token_scores(["012"], responses)
    assert per_token[0].tolist() == pytest.approx([1 / 3, 1 / 3, 0.0, 0.0])
    assert task.score(["012"], responses).item() == pytest.approx(2 / 3)
    with pytest.raises(TaskError, match="'sideways'"):
        TaskConfig(mode="sideways")  # type: ignore[arg-type]


def test_trainer_config_checks_the_node_split() -> None:
    from sc_trainer import TrainerConfig

    with pytest.raises(TrainerConfigError, match=r"workers_per_role \(3\) must split evenly"):
        TrainerConfig(workers_per_role=3, nnodes=2, prompts_per_step=6, responses_per_prompt=1)
    with pytest.raises(TrainerConfigError, match=r"prompts_per_step \(32\) exceeds the 5 training"):
        TrainerConfig(task=TaskConfig(length=1, num_val=5))
    with pytest.raises(TrainerConfigError, match="nnodes=2"):
        TrainerConfig(backend="local", workers_per_role=1, nnodes=2)
