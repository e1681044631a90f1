"""The TensorBoard tracker: scalars in event files under ``<output_dir>/tensorboard``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._extras import missing_extra
from ._values import scalar_metrics

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = ["TENSORBOARD_DIR", "TensorBoardTracker", "load_tensorboard"]

#: The folder of the event files, in the output folder (``tensorboard --logdir`` it).
TENSORBOARD_DIR = "tensorboard"


def load_tensorboard() -> type[SummaryWriter]:
    """torch's ``SummaryWriter``, which writes the event files; it needs the ``tensorboard``
    package, the extra ``sc-trainer[tensorboard]`` (:class:`MissingExtraError` otherwise)."""
    try:  # imported late: only a run that asks for this tracker needs the extra
        import tensorboard  # noqa: F401  (torch's writer needs it: fail here when it is missing)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise missing_extra("tensorboard", "tensorboard", "tensorboard", err) from err
    return SummaryWriter


class TensorBoardTracker:
    """Writes each number of a step as a scalar named as the metric (``train/reward``: in
    TensorBoard's ``train`` section), at the step; the events are flushed after each step."""

    def __init__(self, output_dir: Path) -> None:
        writer = load_tensorboard()
        self.log_dir = output_dir / TENSORBOARD_DIR
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer: SummaryWriter = writer(log_dir=str(self.log_dir))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for name, value in scalar_metrics(metrics).items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
