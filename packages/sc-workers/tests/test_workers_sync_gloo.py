"""Weight sync across processes over gloo: a trainer world and a rollout world, each with its
own default process group and mesh, joined by a sync channel of their own.

For each pair of layouts, the trainer's ranks hold the built-in model from seed 7 (FSDP2 over
dp, optionally tensor parallel inside) and the rollout's ranks a differently initialised copy
(tensor parallel over tp, replicated over replicas). After one sync every rollout rank's
parameters equal the matching slices of the trainer's full parameters (``torch.equal``), and
each rollout rank received exactly as many bytes as its shards hold.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from pathlib import Path

import pytest
import torch
from _workers_helpers import free_port
from _workers_sync_helpers import sync_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _launch(src: tuple[int, int], dst: tuple[int, int], out: Path) -> None:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["_workers_helpers", "_workers_sync_helpers"])
    ports = (free_port(), free_port(), free_port(), free_port())
    total = src[0] * src[1] + dst[0] * dst[1]
    job = functools.partial(sync_job, src, dst, ports)
    procs = [ctx.Process(target=job, args=(r, str(out)), daemon=True) for r in range(total)]
    env = os.environ.copy()
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=240)
        failed = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode != 0}
        if failed:
            raise RuntimeError(f"sync processes exited with {failed} (rank: code)")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        os.environ.clear()
        os.environ.update(env)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        # FSDP2 dp=2 -> TP=2 x 2 replicas: the representative the default run keeps
        pytest.param((2, 1), (2, 2), id="fsdp2-dp2_to_tp2x2"),
        # TP=2 x DP=2 -> TP=1 x 2 replicas
        pytest.param((2, 2), (1, 2), id="tp2xdp2_to_tp1x2", marks=pytest.mark.extended),
        pytest.param((1, 1), (2, 1), id="dp1_to_tp2", marks=pytest.mark.extended),  # dp=1 -> TP=2
    ],
)
def test_rollout_ranks_equal_trainer_slices(
    src: tuple[int, int], dst: tuple[int, int], tmp_path: Path
) -> None:
    _launch(src, dst, tmp_path)
    n_src = src[0] * src[1]
    results = [
        torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        for r in range(n_src + dst[0] * dst[1])
    ]
    full = results[0]["full"]
    for trainer in results[1:n_src]:  # every trainer rank gathers the same full weights
        assert all(torch.equal(trainer["full"][n], t) for n, t in full.items())
    senders = [r["sent"] for r in results[:n_src]]
    if n_src > 1:
        assert min(senders) > 0  # the work is shared, not all sent by rank 0
    for rank, rollout in enumerate(results[n_src:]):
        assert rollout["received"] == rollout["expected_bytes"], rank
        for name, (local, region) in rollout["local"].items():
            whole = full[name]
            expected = whole[
                tuple(slice(o, o + s) for o, s in zip(region.offset, region.shape, strict=True))
            ]
            assert torch.equal(local, expected), (rank, name)
    assert sum(senders) == sum(r["received"] for r in results[n_src:])
