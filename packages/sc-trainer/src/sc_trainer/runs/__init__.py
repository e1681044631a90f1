"""What survives the driver: the output folder, checkpoints, and detached runs.

:class:`RunOutput` writes a run's folder (metrics, plot, trace, checkpoints);
:class:`Checkpointer` saves the workers' and the trainer's state there (in the background
of the next steps), completes and loads it; a detached run (:class:`DetachedRun`, with its
:class:`AttachedDriver` and the :class:`RunState` written as each step begins) outlives its
driver on a standing Ray cluster, and a new driver re-attaches and replays the step in
flight exactly once. What happens when a *worker* dies is in :mod:`sc_trainer.faults`.
"""

from sc_dispatch import _public

from .._errors import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    MissingExtraError,
    RunStateNotFoundError,
)
from ._checkpointer import Checkpointer
from ._detached import DetachedRun
from ._driver import DRIVERS_LOG, AttachedDriver
from ._export import HF_FOLDER, export_checkpoint
from ._output import (
    CONFIG_FILE,
    PLOT_PANELS,
    TRAINER_STATE,
    PendingSave,
    RunOutput,
    check_resumable,
    check_same_data,
    latest_checkpoint,
    read_metrics,
    resolve_checkpoint,
)
from ._state import RUN_STATE, RunState, read_run_state

__all__ = [
    "AttachedDriver",
    "CONFIG_FILE",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "Checkpointer",
    "DRIVERS_LOG",
    "DetachedRun",
    "HF_FOLDER",
    "MissingExtraError",
    "PLOT_PANELS",
    "PendingSave",
    "RUN_STATE",
    "RunOutput",
    "RunState",
    "RunStateNotFoundError",
    "TRAINER_STATE",
    "check_resumable",
    "check_same_data",
    "export_checkpoint",
    "latest_checkpoint",
    "read_metrics",
    "read_run_state",
    "resolve_checkpoint",
]

_public.publish(globals())
