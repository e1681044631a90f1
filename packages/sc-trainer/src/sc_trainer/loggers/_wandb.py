"""The W&B tracker: a Weights & Biases run, offline, under ``<output_dir>/wandb``.

Offline unless the environment asks otherwise (``WANDB_MODE=online``): the run is written to
``<output_dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb`` and nothing goes over the
network; ``wandb sync <that folder>`` uploads it later. Offline, the run also samples no
system metrics and reads no machine information (their probes may reach cloud metadata
endpoints), and W&B's error reporting is off unless ``WANDB_ERROR_REPORTING`` is set. The
run never captures the console (the console tracker owns standard output).

``close`` finishes the run; W&B's service writes the run's last records when it closes the
run's stream, just after (at the latest when the process exits, or at ``wandb.teardown()``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ._extras import missing_extra
from ._values import plain, scalar_metrics

if TYPE_CHECKING:
    from wandb import Run

__all__ = ["WANDB_DIR", "WandbTracker", "load_wandb", "wandb_mode"]

#: The folder W&B writes in, in the output folder.
WANDB_DIR = "wandb"


def load_wandb() -> ModuleType:
    """The ``wandb`` module: the extra ``sc-trainer[wandb]`` (:class:`MissingExtraError`
    otherwise)."""
    try:  # imported late: only a run that asks for this tracker needs the extra
        import wandb
    except ImportError as err:
        raise missing_extra("wandb", "wandb", "wandb", err) from err
    module: ModuleType = wandb
    return module


def wandb_mode() -> str:
    """``"online"`` when ``WANDB_MODE`` says so, else ``"offline"`` (the default)."""
    return "online" if os.environ.get("WANDB_MODE", "").strip().lower() == "online" else "offline"


def _settings(wandb: ModuleType, mode: str) -> Any:
    """The run's ``wandb.Settings``: ``mode``, one run per tracker, no console capture; and,
    offline, nothing that probes the machine or the network. A setting this W&B version does
    not know is left out."""
    wanted: dict[str, Any] = {
        "mode": mode,
        "console": "off",
        "quiet": True,
        "reinit": "create_new",
    }
    if mode == "offline":
        wanted |= {"x_disable_stats": True, "x_disable_machine_info": True}
    known = getattr(wandb.Settings, "model_fields", wanted)
    return wandb.Settings(**{k: v for k, v in wanted.items() if k in known})


class WandbTracker:
    """Logs each step's numbers to one W&B run at the step (metric names as they are:
    ``train/reward`` is the ``train`` section); the run is named ``experiment_name`` in
    project ``project_name`` and carries ``config`` as its configuration."""

    def __init__(
        self,
        output_dir: Path,
        *,
        project_name: str,
        experiment_name: str,
        config: Mapping[str, Any],
    ) -> None:
        wandb = load_wandb()
        self.mode = wandb_mode()
        if self.mode == "offline":
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        output_dir.mkdir(parents=True, exist_ok=True)
        self._run: Run = wandb.init(
            project=project_name,
            name=experiment_name,
            config=plain(config),
            dir=str(output_dir),
            settings=_settings(wandb, self.mode),
        )
        self.run_dir = Path(self._run.dir).parent  # .../wandb/offline-run-<time>-<id>

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self._run.log(scalar_metrics(metrics), step=step)

    def close(self) -> None:
        self._run.finish()
