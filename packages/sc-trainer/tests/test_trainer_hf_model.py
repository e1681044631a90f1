"""``sc-demo --model PATH``: a Hugging Face model directory trained on the task as text.

The model is a tiny Qwen2 built and saved here (``_trainer_hf``); it is loaded back
through the same code a user's checkpoint takes (``load_hf_tokenizer``, ``hf_model_config``,
the workers' ``AutoModelForCausalLM`` / ``AutoModel`` loading).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from _trainer_hf import build_tokenizer, save_tiny_qwen2
from _trainer_runs import assert_finite_training_metrics, tiny_config
from sc_trainer import (
    TaskConfig,
    TaskRunner,
    TrainerConfig,
    TrainerConfigError,
    make_launcher,
    make_task,
)
from sc_trainer.cli import build_parser, config_from_args
from sc_trainer.cli import demo_main as main
from sc_trainer.config import TaskError
from sc_trainer.runs import read_metrics
from sc_trainer.tasks import TextDigitsTask
from sc_trainer.trainer import model_config

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_qwen2(tmp_path_factory.mktemp("hf") / "tiny-qwen2")


class MergingTokenizer:
    """A tokenizer that writes "12" as one token, so token and digit counts differ."""

    pad_token_id = 0
    eos_token_id = 1
    bos_token_id = None
    _pieces: ClassVar[list[str]] = ["<pad>", "<eos>", "12", *"0123456789="]

    def _encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            if text.startswith("12", i):
                ids.append(2)
                i += 2
            else:
                ids.append(self._pieces.index(text[i]))
                i += 1
        return ids

    def __call__(self, texts: Sequence[str], add_special_tokens: bool) -> dict[str, Any]:
        return {"input_ids": [self._encode(t) for t in texts]}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return " ".join(self._pieces[i] for i in ids if i > 1 or not skip_special_tokens)


def test_text_task_pads_prompts_of_different_token_counts() -> None:
    task = TextDigitsTask(TaskConfig(length=3, num_val=16), MergingTokenizer())
    # "12x=" is 3 tokens, other prompts 4; answers ("x21": 2 tokens at least) need up to 3 + eos
    assert task.prompt_length == 4
    assert task.response_length == 4
    batch = task.encode_prompts(["120", "345"])
    assert batch["input_ids"].tolist() == [[0, 2, 3, 13], [6, 7, 8, 13]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 0, 1, 2], [0, 1, 2, 3]]


def test_text_task_scores_the_decoded_answer_on_the_last_token() -> None:
    task = TextDigitsTask(TaskConfig(length=3, num_val=16), MergingTokenizer())
    # target of "213" is "312": tokens 6 ("3") 2 ("12"), then eos
    responses = torch.tensor([[6, 2, 1, 0], [6, 4, 4, 1], [6, 2, 1, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    scores = task.token_scores(["213", "213", "213"], responses, mask)
    expected = torch.tensor([[0, 0, 1, 0], [0, 0, 0, 2 / 3], [0, 0, 0, 0]])  # "311": 2 of 3
    torch.testing.assert_close(scores, expected)
    assert task.score(["213"], responses[:1], mask[:1]).tolist() == [1.0]


def test_text_task_errors() -> None:
    task = TextDigitsTask(TaskConfig(length=3, num_val=16), MergingTokenizer())
    with pytest.raises(TaskError, match=r"expected responses of shape \[2, R\], got \[1, 4\]"):
        task.token_scores(["123", "456"], torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(TaskError, match=r"response_mask shape \[1, 3\] differs"):
        task.token_scores(["123"], torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 3))
    with pytest.raises(TaskError, match=r"prompt '12a' is not 3 digits"):
        task.encode_prompts(["12a"])
    with pytest.raises(TaskError, match="got no prompts"):
        task.encode_prompts([])
    no_pad = MergingTokenizer()
    no_pad.pad_token_id = None  # type: ignore[assignment]
    with pytest.raises(TaskError, match="the tokenizer has no pad_token_id"):
        TextDigitsTask(TaskConfig(length=3, num_val=16), no_pad)


def test_model_path_config(model_dir: str, tmp_path: Path) -> None:
    config = tiny_config(tmp_path, model_path=model_dir)
    assert not config.uses_absolute_positions
    task = make_task(config)
    assert isinstance(task, TextDigitsTask)
    assert task.prompt_length == 5  # <bos>, 3 digits, "="
    model = model_config(config, task)
    assert (model.path, model.vocab_size, model.eos_token_ids) == (model_dir, 14, (1,))
    with pytest.raises(TrainerConfigError, match="absolute_positions is an option of the built-in"):
        tiny_config(tmp_path, model_path=model_dir, absolute_positions=True)
    with pytest.raises(TrainerConfigError, match="model_path must not be empty"):
        tiny_config(tmp_path, model_path="")
    with pytest.raises(TrainerConfigError, match=r"device must be one of \('cpu', 'cuda'\)"):
        tiny_config(tmp_path, device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_cuda_without_a_gpu_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TrainerConfigError, match="no CUDA device is visible"):
        make_launcher(tiny_config(tmp_path, device="cuda"))


def test_cli_model_flag(model_dir: str, tmp_path: Path) -> None:
    args = build_parser().parse_args(["--model", model_dir, "--device", "cpu"])
    config = config_from_args(args)
    assert (config.model_path, config.device, config.absolute_positions) == (model_dir, "cpu", None)
    out = tmp_path / "run"
    argv = ["--model", model_dir, "--backend", "local", "--steps", "2", "--val-every", "2"]
    argv += ["--prompts-per-step", "8", "--responses-per-prompt", "2", "--task-length", "3"]
    argv += ["--no-progress", "--output-dir", str(out)]
    assert main(argv) == 0
    history = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in history] == [0, 1, 2]
    assert_finite_training_metrics(history, critic=True)
    assert 0.0 <= history[-1]["val/reward"] <= 1.0


def test_model_path_on_ray_fsdp_dp2(model_dir: str, ray_cluster: None, tmp_path: Path) -> None:
    config = tiny_config(tmp_path, model_path=model_dir, workers_per_role=2)
    result = TaskRunner(config).run()
    history = read_metrics(result.output.metrics_path)
    assert [r["step"] for r in history] == [0, 1, 2, 3, 4]
    assert_finite_training_metrics(history, critic=True)
    assert (result.checkpoint / "actor").is_dir()


def test_model_path_grpo_local(model_dir: str, tmp_path: Path) -> None:
    result = TaskRunner(tiny_config(tmp_path, model_path=model_dir, algorithm="grpo")).run()
    assert_finite_training_metrics(read_metrics(result.output.metrics_path), critic=False)


def test_tokenizer_round_trip() -> None:
    tok = build_tokenizer()
    ids = tok("3805=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5
    assert "".join(tok.decode(ids, skip_special_tokens=True).split()) == "3805="
    assert TrainerConfig().uses_absolute_positions
