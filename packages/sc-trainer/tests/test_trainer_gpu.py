"""``sc-demo --device cuda`` for a few steps (the ``gpu`` nox session; skipped without a GPU):
on the local backend and on Ray (one worker per role, one GPU each), PPO with the critic
colocated, the nccl process group and bf16 mixed precision of the default FSDP settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sc_trainer.cli import demo_main as main
from sc_trainer.runs import read_metrics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available())"
    ),
    pytest.mark.timeout(300),
]


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_demo_on_cuda(backend: str, tmp_path: Path) -> None:
    if backend == "ray":
        pytest.importorskip("ray")
    argv = ["--device", "cuda", "--backend", backend, "--workers-per-role", "1"]
    argv += ["--steps", "5", "--val-every", "5", "--save-every", "5", "--no-progress"]
    argv += ["--output-dir", str(tmp_path)]
    assert main(argv) == 0
    history = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in history] == [0, 1, 2, 3, 4, 5]
    for record in history[1:]:
        assert torch.isfinite(torch.tensor(record["actor/pg_loss"]))
        assert torch.isfinite(torch.tensor(record["critic/vf_loss"]))
