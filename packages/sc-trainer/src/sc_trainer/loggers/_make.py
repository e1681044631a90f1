"""``make_trackers``: the trackers a run asks for by name, built before it trains."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._errors import TrainerConfigError
from ._console import ConsoleTracker
from ._jsonl import JsonlTracker
from ._mlflow import MlflowTracker, load_mlflow
from ._protocol import Tracker
from ._tensorboard import TensorBoardTracker, load_tensorboard
from ._tracking import Tracking
from ._wandb import WandbTracker, load_wandb

__all__ = ["TRACKER_NAMES", "make_trackers"]

logger = logging.getLogger(__name__)

#: The trackers :func:`make_trackers` knows (verl's ``trainer.logger`` names, and ``jsonl``).
TRACKER_NAMES: tuple[str, ...] = ("console", "jsonl", "tensorboard", "wandb", "mlflow")

#: What a tracker's extra needs, imported before any tracker is built.
_EXTRAS: dict[str, Callable[[], object]] = {
    "tensorboard": load_tensorboard,
    "wandb": load_wandb,
    "mlflow": load_mlflow,
}


def _checked(names: Sequence[str]) -> list[str]:
    """``names``, each known and none twice (:class:`TrainerConfigError` otherwise)."""
    if isinstance(names, str):
        raise TrainerConfigError(
            f"trackers: give a sequence of tracker names, not the string {names!r} "
            f"(did you mean [{names!r}]?)"
        )
    known = ", ".join(TRACKER_NAMES)
    seen: list[str] = []
    for name in names:
        if not isinstance(name, str) or name not in TRACKER_NAMES:
            close = difflib.get_close_matches(str(name), TRACKER_NAMES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise TrainerConfigError(
                f"trackers: unknown tracker {name!r}; {hint}the trackers are: {known}"
            )
        if name in seen:
            raise TrainerConfigError(
                f"trackers: {name!r} is named twice in {list(names)}; name each tracker once"
            )
        seen.append(name)
    return seen


def _build(
    name: str,
    output_dir: Path,
    project_name: str,
    experiment_name: str,
    config: Mapping[str, Any],
) -> Tracker:
    if name == "console":
        return ConsoleTracker()
    if name == "jsonl":
        return JsonlTracker(output_dir)
    if name == "tensorboard":
        return TensorBoardTracker(output_dir)
    tracker = WandbTracker if name == "wandb" else MlflowTracker
    return tracker(
        output_dir, project_name=project_name, experiment_name=experiment_name, config=config
    )


def make_trackers(
    names: Sequence[str],
    output_dir: Path,
    *,
    project_name: str,
    experiment_name: str,
    config: Mapping[str, Any],
) -> Tracking:
    """The trackers ``names`` (each one of :data:`TRACKER_NAMES`), writing under
    ``output_dir``, as one :class:`Tracking`.

    * ``console``: one line per step on standard output (step and the main metrics,
      rounded);
    * ``jsonl``: ``<output_dir>/tracking.jsonl``, one object per step with the numbers the
      trackers received (the run's own ``metrics.jsonl`` is written by the run, always, and
      left alone);
    * ``tensorboard``: event files under ``<output_dir>/tensorboard`` (extra
      ``sc-trainer[tensorboard]``);
    * ``wandb``: an offline W&B run under ``<output_dir>/wandb`` (extra ``sc-trainer[wandb]``);
    * ``mlflow``: an MLflow run in the file store ``<output_dir>/mlruns``, or where
      ``MLFLOW_TRACKING_URI`` says (extra ``sc-trainer[mlflow]``).

    W&B and MLflow name the run ``experiment_name`` in project (experiment) ``project_name``
    and record ``config``. Every tracker records a step's numbers only: ``int`` and ``float``,
    ``bool`` as 0/1; ``None``, non-finite numbers, strings and lists are skipped, and so is
    the record's ``"step"``, which is the step itself.

    Everything is checked before anything is built: an unknown name, one named twice or an
    empty project or experiment name raises :class:`TrainerConfigError` (an unknown name with
    the closest known one), a tracker whose extra is not installed :class:`MissingExtraError`
    (naming the extra). A tracker that fails to
    start closes those already started, then its error is raised.
    """
    chosen = _checked(names)
    for what, value in (("project_name", project_name), ("experiment_name", experiment_name)):
        if not isinstance(value, str) or not value.strip():
            raise TrainerConfigError(f"trackers: {what} must be a non-empty string, got {value!r}")
    for name in chosen:
        load = _EXTRAS.get(name)
        if load is not None:
            load()
    built: dict[str, Tracker] = {}
    try:
        for name in chosen:
            built[name] = _build(name, output_dir, project_name, experiment_name, config)
    except BaseException:
        try:
            Tracking(built).close()
        except Exception:
            logger.exception("closing the trackers already started failed")
        raise
    logger.info("trackers: %s", ", ".join(chosen) or "none")
    return Tracking(built)
