"""Experiment trackers: a run's step metrics on the console, in TensorBoard, W&B, MLflow.

As verl's ``trainer.logger=[console, wandb, tensorboard, mlflow]``: :func:`make_trackers`
builds the trackers a run names (:data:`TRACKER_NAMES`) before it trains, as one
:class:`Tracking` whose ``log(metrics, step)`` gives each step's flat metrics record to every
:class:`Tracker` and whose ``close()`` closes them all. Each writes under the run's output
folder::

    <output-dir>/
        tracking.jsonl     jsonl: one object per step, the numbers the trackers received
        tensorboard/       tensorboard: event files (tensorboard --logdir <output-dir>/tensorboard)
        wandb/             wandb: the offline run (wandb sync <output-dir>/wandb/offline-run-*)
        mlruns/            mlflow: the local file store (unless MLFLOW_TRACKING_URI is set)

``console`` writes one line per step on standard output. TensorBoard, W&B and MLflow are
extras: ``pip install 'sc-trainer[tensorboard]'`` (``[wandb]``, ``[mlflow]``); without one,
:func:`make_trackers` raises :class:`MissingExtraError`, an unknown or repeated name
:class:`TrainerConfigError`.
"""

from sc_dispatch import _public

from .._errors import MissingExtraError, TrainerConfigError
from ._make import TRACKER_NAMES, make_trackers
from ._protocol import Tracker
from ._tracking import Tracking

__all__ = [
    "MissingExtraError",
    "TRACKER_NAMES",
    "Tracker",
    "Tracking",
    "TrainerConfigError",
    "make_trackers",
]

_public.publish(globals())
