"""The PPO loop that the actor and the critic share, plain and pipelined (``run_ppo``), on a
stand-in engine: epochs x mini-batches optimizer steps, the seeded shuffle (the same order
on a rank with the loss and one without), micro-batches, and the step metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
import torch
import torch.distributed as dist
from sc_workers import BatchError, BatchSizes, CriticConfig
from sc_workers.engine import Engine
from sc_workers.workers._ppo_loop import Meter, MiniBatch, Role, run_ppo
from torch import Tensor

ROWS, RESP = 8, 3


@pytest.fixture(scope="module", autouse=True)
def _one_rank() -> Iterator[None]:
    """A single-rank process group for the meter, gone afterwards if this module made it."""
    if dist.is_initialized():
        yield
        return
    store = dist.HashStore()  # type: ignore[attr-defined]  # not re-exported in stubs
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Engine:
    """What run_ppo asks of an engine, recorded."""

    def __init__(self) -> None:
        self.dp_group = dist.group.WORLD
        self.grad_average_ranks = 1
        self.calls: list[str] = []

    def train_mode(self) -> None:
        self.calls.append("train")

    def zero_grad(self) -> None:
        self.calls.append("zero")

    def optimizer_step(self, grad_clip: float) -> float:
        self.calls.append("step")
        return float(self.calls.count("step"))


def _loss(output: Any, micro: dict[str, Tensor], denominator: float, meter: Meter) -> Tensor:
    meter.add("x/rows", torch.tensor(float(len(micro["rows"]))))
    meter.add("x/tok", response_tokens(micro))
    return torch.zeros(())


def response_tokens(micro: dict[str, Tensor]) -> Tensor:
    return micro["response_mask"].sum().double()


ROLE = Role(
    head=lambda micro: lambda out: out,
    loss=_loss,
    per_token=("x/tok",),
    grad_norm="x/grad_norm",
    constants={"x/const": 0.5},
)


def _run(
    seed: int, has_loss: bool = True, rows: int = ROWS
) -> tuple[dict[str, float], list[list[list[int]]], list[str]]:
    engine = _Engine()
    steps: list[list[list[int]]] = []

    def accumulate(mb: MiniBatch, role: Role, meter: Meter, grad_scale: float) -> None:
        steps.append([m["rows"].tolist() for m in mb.micro_batches])
        for micro in mb.micro_batches:
            role.loss(role.head(micro)(micro["rows"]), micro, mb.denominator, meter)

    config = CriticConfig(ppo_epochs=2, shuffle=True)
    tensors = {"rows": torch.arange(rows), "response_mask": torch.ones(rows, RESP)}
    metrics = run_ppo(
        cast(Engine, engine),
        tensors,
        rows,
        config,
        BatchSizes(mini_batch_size=4, micro_batch_size=2),
        seed,
        "update_critic (rank 0)",
        ROLE,
        accumulate,
        has_loss,
    )
    return metrics, steps, engine.calls


def test_epochs_mini_batches_and_micro_batches() -> None:
    metrics, steps, calls = _run(seed=3)
    assert calls == ["train", *["zero", "step"] * 4]  # 2 epochs x 2 mini-batches
    assert [len(s) for s in steps] == [2] * 4
    assert all(len(m) == 2 for s in steps for m in s)
    gen = torch.Generator().manual_seed(3)
    for epoch in range(2):
        order = torch.randperm(ROWS, generator=gen).tolist()
        seen = [r for s in steps[2 * epoch : 2 * epoch + 2] for m in s for r in m]
        assert seen == order
    # rows summed per step, averaged over steps; tokens per token of the step; the constants
    assert metrics == {
        "x/rows": 4.0,
        "x/tok": 1.0,
        "x/grad_norm": 2.5,
        "x/const": 0.5,
    }


def test_a_rank_without_the_loss_steps_in_the_same_order() -> None:
    metrics, steps, calls = _run(seed=3, has_loss=False)
    assert calls == _run(seed=3)[2]
    assert steps == _run(seed=3)[1]
    assert metrics == {}  # no loss metrics, no grad norm, no constants
    assert steps != _run(seed=4)[1]  # the seed decides the order


def test_a_batch_that_does_not_split_into_mini_batches() -> None:
    with pytest.raises(BatchError, match="batch of 6 sequences is not divisible by the per-rank"):
        _run(seed=0, rows=6)
