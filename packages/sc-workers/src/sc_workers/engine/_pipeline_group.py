"""The process group of a pipeline's sends and receives, and its end when a stage fails.

Each column of the ``(pp, dp, tp)`` mesh (same dp and tp rank, every stage) gets a gloo
group of its own for the schedules' point-to-point traffic, with its own timeout
(``SC_WORKERS_PIPELINE_TIMEOUT_S``). When a stage fails inside a schedule, its peers are
blocked in a receive from it (or a send to it). Destroying a group whose references are all
dropped closes its connections: the peers' operations fail at once ("connection closed by
peer"), instead of after the timeout, and they tear their own groups down in turn. The
groups of FSDP and tensor parallelism are not touched.
"""

from __future__ import annotations

import gc
from datetime import timedelta

import torch.distributed as dist

from .._errors import ConfigError
from ._parallel import ParallelLayout

__all__ = ["pipeline_group", "root_cause", "tear_down"]


def pipeline_group(layout: ParallelLayout, timeout: timedelta) -> dist.ProcessGroup:
    """This rank's pipeline column as a group of its own. ``new_group`` is a collective:
    every rank creates every column, in the same order."""
    mine: dist.ProcessGroup | None = None
    for dp in range(layout.dp_size):
        for tp in range(layout.tp_size):
            ranks = [
                (pp * layout.dp_size + dp) * layout.tp_size + tp for pp in range(layout.pp_size)
            ]
            group = dist.new_group(ranks, timeout=timeout)
            if isinstance(group, dist.ProcessGroup) and layout.rank in ranks:
                mine = group
    if mine is None:  # pragma: no cover - every rank is in one column
        raise ConfigError(f"rank {layout.rank} is in no pipeline column")
    return mine


def tear_down(group: dist.ProcessGroup | None) -> None:
    """Destroy ``group`` after a failed schedule, once the caller has dropped its own
    reference and the failed schedule's error (whose frames, and the schedule's pending
    sends and receives, hold the group): the collection frees the last references, and
    gloo closes the group's connections."""
    if group is not None:
        dist.destroy_process_group(group)
        del group
    gc.collect()


def root_cause(exc: BaseException) -> tuple[str, bool]:
    """The innermost error of a chain (torch's schedule wraps a stage's error in its own),
    as ``Type: message``, and whether it is a peer's failure seen from here (a connection
    of the pipeline group that closed or reset: the peer stage failed or died)."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = str(root).strip()
    if "Connection closed by peer" in text or "Connection reset by peer" in text:
        first_line = text.splitlines()[0][:200] if text else ""
        return (
            "a peer stage failed or died, and the pipeline group's connection to it closed "
            f"({type(root).__name__}: {first_line})",
            True,
        )
    return f"{type(root).__name__}: {text}", False
