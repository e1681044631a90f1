"""A rank that raises inside a collective does not strand its peers (gloo on CPU, 2 ranks).

Rank 1's ``update_actor`` raises while rank 0 is in (or about to enter) a collective with
it: inside FSDP's backward (reduce-scatters), inside a tensor-parallel backward
(all-reduces), and, with pipeline parallelism, before the last stage enters its schedule
(the first stage is already waiting in it). Rank 1 publishes its error and tears its
process groups down; rank 0 raises :class:`~sc_workers.CollectiveAbortedError` (or
:class:`~sc_workers.PipelineStageError`) naming rank 1 within 10 s, not after
``SC_WORKERS_PG_TIMEOUT_S`` (set to 300 s here). The next call on both ranks rebuilds the
groups and the engine, with the weights and the schedule the engine had, and works.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from _workers_abort_helpers import FAILING, abort_job
from _workers_helpers import launch

#: how fast a peer of the failed rank must raise (the bound of the feature)
RELEASED_WITHIN_S = 10.0
#: the whole run (two processes: start, build, a failed update, a rebuild, two good calls)
RUN_TIMEOUT_S = 180.0


def _run(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    # a peer stranded until a timeout would take minutes: the bound below tells them apart
    monkeypatch.setenv("SC_WORKERS_PG_TIMEOUT_S", "300")
    monkeypatch.setenv("SC_WORKERS_PIPELINE_TIMEOUT_S", "300")
    launch(functools.partial(abort_job, case), 2, tmp_path, timeout=RUN_TIMEOUT_S)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        "fsdp",  # the representative the default run keeps
        pytest.param("tp", marks=pytest.mark.extended),
        pytest.param("pp", marks=pytest.mark.extended),
    ],
)
def test_a_rank_raising_in_a_collective_releases_its_peer_and_the_next_call_rebuilds(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outs = _run(case, tmp_path, monkeypatch)
    failed, peer = outs[FAILING], outs[1 - FAILING]

    # the failed rank raises its own error, with a note saying it tore the groups down
    own = failed["outcome"]
    assert own["kind"] not in ("ok", "CollectiveAbortedError"), own
    assert own["caused_by_peer"] is not True, own
    assert any(f"rank {FAILING} failed in" in note for note in own["notes"]), own
    assert failed["elapsed"] < RELEASED_WITHIN_S, failed

    # its peer raises within the bound, with an error naming the failed rank and its error
    aborted = peer["outcome"]
    # a pipeline stage inside its schedule raises PipelineStageError (a subclass); one the
    # abort reaches before it enters its call (the failed rank was quicker) raises the base
    expected = {"CollectiveAbortedError"}
    if case == "pp":
        expected.add("PipelineStageError")
    assert aborted["kind"] in expected, aborted
    assert aborted["failed_rank"] == FAILING, aborted
    assert aborted["caused_by_peer"] is True, aborted
    assert f"rank {FAILING} failed" in aborted["message"], aborted
    assert peer["elapsed"] < RELEASED_WITHIN_S, peer

    # the next calls rebuild the groups and the engine, with what the engine held
    for rank, out in enumerate(outs):
        assert out["after"] == {"kind": "ok", "finite": True}, (rank, out["after"])
        assert out["rebuilt_engine"], rank
        assert out["kept_weights"], rank
        assert out["lr_kept"], rank
        assert out["after_elapsed"] < RUN_TIMEOUT_S / 2, (rank, out["after_elapsed"])
    # the update after the rebuild ran on both ranks with the same (dp-reduced) metrics
    if case == "fsdp":
        first, second = (out["after_metrics"]["actor/pg_loss"] for out in outs)
        assert first == pytest.approx(second), (first, second)
