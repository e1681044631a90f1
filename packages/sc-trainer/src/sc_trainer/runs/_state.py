"""The driver's state at a step boundary, for a driver that re-attaches: ``run_state.json``.

A detached run's driver writes, atomically, as each step begins and before the step's
first call, what a new driver needs to take over that step: which step and which call
scope are in flight (the scope numbers the call ids the workers journal, see sc-core's
``CallIds``), how far training got (``global_step``; the metrics up to it are in
``metrics.jsonl``), the checkpoint the workers may still be writing, the weight-sync
version, and the rollout source's versions and the generation it launched; with engine
servers, the fleet's names and the push bookkeeping (``ServersSnapshot``). It is
small: no tensors, no metrics history. A new driver replays the step from its start with
the same call ids; every call the workers already ran is answered from their journals, so
nothing runs twice and nothing is lost.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._errors import RunStateNotFoundError
from ..rollout import RolloutSnapshot

__all__ = ["RUN_STATE", "RunState", "read_run_state", "write_run_state"]

#: The file in the output folder.
RUN_STATE = "run_state.json"


@dataclass(frozen=True)
class RunState:
    """What a re-attaching driver reads (see the module docstring)."""

    run_id: str
    #: the step in flight (0: the run's prologue: first sync, validation and checkpoint)
    step: int
    #: the call scope of that step (grows by one per step begun, recoveries included)
    scope: int
    global_step: int
    recoveries: int = 0
    #: the checkpoint whose workers may still be writing: its step and trainer state
    pending_save_step: int | None = None
    pending_save_state: dict[str, Any] | None = None
    #: what the rollout source hands to the next driver (its versions, its launched step)
    rollout: RolloutSnapshot = field(default_factory=RolloutSnapshot)
    #: the call scope of the generation ``rollout.launched_step`` was launched in
    launched_scope: int | None = None
    #: the driver was recovering from a worker's death (a new driver recovers again)
    recovering: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunState:
        raw = json.loads(text)
        rollout = RolloutSnapshot.from_dict(raw.pop("rollout", {}))
        return cls(**raw, rollout=rollout)


def write_run_state(folder: Path, state: RunState) -> None:
    """Replace ``folder/run_state.json`` with ``state`` atomically (write, fsync, rename)."""
    path = folder / RUN_STATE
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(state.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_run_state(folder: Path, run_id: str) -> RunState:
    """The state a driver of run ``run_id`` wrote in ``folder``; :class:`RunStateNotFoundError`
    when there is none, it is unreadable, or it belongs to another run."""
    path = folder / RUN_STATE
    try:
        state = RunState.from_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunStateNotFoundError(
            f"re-attach to run {run_id!r}: {path} does not exist; give the output folder "
            "(--output-dir) the run's first driver wrote to"
        ) from None
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise RunStateNotFoundError(
            f"re-attach to run {run_id!r}: cannot read {path}: {err}"
        ) from err
    if state.run_id != run_id:
        raise RunStateNotFoundError(
            f"re-attach to run {run_id!r}: {path} belongs to run {state.run_id!r}"
        )
    return state
