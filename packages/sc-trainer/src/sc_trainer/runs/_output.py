"""The output folder of a run.

::

    <output-dir>/
        metrics.jsonl           one JSON object per training step
        metrics.png             reward, KL and losses over steps
        trace.json              every controller call, Chrome/Perfetto trace format
        checkpoints/
            latest              the step number of the newest complete checkpoint
            global_step_<N>/    one checkpoint: worker state, trainer state, metrics so far
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sc_workers import published_step

from .._errors import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    MissingExtraError,
    TrainerConfigError,
)
from ..config import TrainerConfig

__all__ = [
    "CONFIG_FILE",
    "PLOT_PANELS",
    "TRAINER_STATE",
    "PendingSave",
    "RunOutput",
    "check_resumable",
    "check_same_data",
    "latest_checkpoint",
    "read_metrics",
    "resolve_checkpoint",
]

logger = logging.getLogger(__name__)

#: Panels of the plot: a title and the metric keys drawn in it (missing keys are skipped).
PLOT_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("train/reward", "val/reward")),
    ("KL to reference", ("actor/kl_ref",)),
    ("actor: policy loss and entropy", ("actor/pg_loss", "actor/entropy")),
    ("critic loss", ("critic/vf_loss",)),
)

_LATEST = "latest"
_STEP_PREFIX = "global_step_"
TRAINER_STATE = "trainer_state.json"


@dataclass(frozen=True)
class PendingSave:
    """A checkpoint the workers are writing: what completes it once they are done."""

    step: int
    state: dict[str, Any]
    history: list[dict[str, Any]]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file (an absent file has none)."""
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The checkpoint folder ``path`` names.

    ``path`` may be a checkpoint folder (``.../global_step_N``), a ``checkpoints`` folder, or
    an output folder; the last two resolve to their newest complete checkpoint.
    """
    p = Path(path)
    if (p / TRAINER_STATE).is_file():
        return p
    for root in (p, p / "checkpoints"):
        latest = root / _LATEST
        if latest.is_file():
            step = latest.read_text(encoding="utf-8").strip()
            candidate = root / f"{_STEP_PREFIX}{step}"
            if (candidate / TRAINER_STATE).is_file():
                return candidate
            raise CheckpointNotFoundError(
                f"resume: {latest} names step {step!r}, but {candidate} has no {TRAINER_STATE}"
            )
    raise CheckpointNotFoundError(
        f"resume: {p} is neither a checkpoint folder (with {TRAINER_STATE}) nor an output "
        f"or checkpoints folder with a '{_LATEST}' file"
    )


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or ``None`` when there is none."""
    try:
        return resolve_checkpoint(root)
    except FileNotFoundError:
        return None


class RunOutput:
    """Writes one run's output folder (see the module docstring for its layout)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.checkpoint_root.mkdir(exist_ok=True)

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def plot_path(self) -> Path:
        return self.root / "metrics.png"

    @property
    def trace_path(self) -> Path:
        return self.root / "trace.json"

    @property
    def checkpoint_root(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint_dir(self, step: int) -> Path:
        """The folder of the checkpoint taken after ``step`` steps (not created)."""
        return self.checkpoint_root / f"{_STEP_PREFIX}{step}"

    def start(self, history: Sequence[Mapping[str, Any]] = ()) -> None:
        """Begin ``metrics.jsonl`` afresh, holding ``history`` (the records of a resumed run)."""
        text = "".join(json.dumps(dict(rec), sort_keys=True) + "\n" for rec in history)
        _atomic_write_text(self.metrics_path, text)

    def log_metrics(self, record: Mapping[str, Any]) -> None:
        """Append one record (one training step) to ``metrics.jsonl``."""
        clean = {k: _jsonable(v) for k, v in record.items()}
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(clean, sort_keys=True) + "\n")

    def finish_checkpoint(
        self,
        step: int,
        trainer_state: Mapping[str, Any],
        history: Sequence[Mapping[str, Any]] | None = None,
    ) -> Path:
        """Complete the checkpoint of ``step``: trainer state, metrics so far, ``latest``.

        The workers have already written their state into :meth:`checkpoint_dir`; the trainer
        state is written last, so a folder without it is an incomplete checkpoint. The metrics
        are ``history`` (the records up to ``step``), or what ``metrics.jsonl`` holds now.
        """
        folder = self.checkpoint_dir(step)
        folder.mkdir(parents=True, exist_ok=True)
        if history is not None:
            metrics = "".join(json.dumps(dict(rec), sort_keys=True) + "\n" for rec in history)
        elif self.metrics_path.exists():
            metrics = self.metrics_path.read_text(encoding="utf-8")
        else:
            metrics = ""
        _atomic_write_text(folder / "metrics.jsonl", metrics)
        _atomic_write_text(
            folder / TRAINER_STATE, json.dumps(dict(trainer_state), indent=2, sort_keys=True)
        )
        _atomic_write_text(self.checkpoint_root / _LATEST, f"{step}\n")
        return folder

    def complete_save(self, pending: PendingSave, keep: int) -> Path:
        """Write the trainer's part of ``pending`` (its workers are done) and keep only the
        newest ``keep`` checkpoints; the completed folder."""
        folder = self.finish_checkpoint(pending.step, pending.state, pending.history)
        self.prune_checkpoints(keep)
        logger.info("checkpoint of step %d complete: %s", pending.step, folder)
        return folder

    def settle_save(self, pending: PendingSave, roles: Sequence[str], keep: int) -> None:
        """In a recovery, where the workers may be gone: complete ``pending`` if every role's
        rank 0 has published it (its files say so), else abandon it."""
        folder = self.checkpoint_dir(pending.step)
        if all(published_step(folder / role) == pending.step for role in roles):
            self.complete_save(pending, keep)  # found published on disk
        else:
            logger.warning("the checkpoint of step %d was not complete; abandoned", pending.step)

    def prune_checkpoints(self, keep: int) -> list[Path]:
        """Remove all but the newest ``keep`` complete checkpoints, and the incomplete ones
        older than the newest complete one (saves that died); returns what it removed. A
        folder newer than the newest complete one may be a save in progress and stays."""
        if keep < 1:
            raise TrainerConfigError(f"prune_checkpoints: keep must be >= 1, got {keep}")
        found: list[tuple[int, Path]] = []
        root = self.checkpoint_root
        for child in root.iterdir() if root.is_dir() else ():
            number = child.name.removeprefix(_STEP_PREFIX)
            if child.is_dir() and child.name.startswith(_STEP_PREFIX) and number.isdigit():
                found.append((int(number), child))
        complete = sorted(n for n, p in found if (p / TRAINER_STATE).is_file())
        if not complete:
            return []
        kept = set(complete[-keep:])
        removed = [p for n, p in sorted(found) if n not in kept and n < complete[-1]]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
            logger.info("removed checkpoint %s (keeping the newest %d)", path, keep)
        return removed

    def write_plot(self, records: Sequence[Mapping[str, Any]] | None = None) -> Path:
        """Draw :data:`PLOT_PANELS` from ``records`` (default: ``metrics.jsonl``) as a PNG.
        Needs matplotlib, the extra ``sc-trainer[plot]`` (:class:`MissingExtraError`
        otherwise)."""
        try:  # imported late: only the end of a run needs it, and it is an extra
            from matplotlib.figure import Figure
        except ImportError as err:
            raise MissingExtraError(
                f"RunOutput.write_plot: drawing {self.plot_path.name} needs matplotlib; "
                "install the extra: pip install 'sc-trainer[plot]'"
            ) from err

        rows = list(records) if records is not None else read_metrics(self.metrics_path)
        fig = Figure(figsize=(10, 7), layout="constrained")
        axes = fig.subplots(2, 2).ravel()
        for ax, (title, keys) in zip(axes, PLOT_PANELS, strict=True):
            for key in keys:
                pts = [
                    (r["step"], r[key])
                    for r in rows
                    if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
                ]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, label=key, marker="o" if len(pts) < 30 else None)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(visible=True, alpha=0.3)
            if ax.lines:
                ax.legend(loc="best", fontsize="small")
            else:
                ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
        fig.savefig(self.plot_path, dpi=100)
        return self.plot_path


def _jsonable(value: Any) -> Any:
    """Plain JSON for a metric value: numbers (non-finite as null), strings, lists."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    item = getattr(value, "item", None)  # torch / numpy scalars
    if callable(item):
        return _jsonable(item())
    return str(value)


#: Settings a resumed run must share with the run that wrote the checkpoint (the worker
#: state is sharded per rank and shaped by the model and task).
_RESUME_KEYS = (
    "algorithm",
    "workers_per_role",
    "nnodes",
    "hidden_size",
    "num_layers",
    "num_heads",
    "absolute_positions",
    "model_path",
    "placement",
    "rollout_tp",
    "task",
)


#: the resolved configuration a run writes into its output folder (``sc-train --config`` it)
CONFIG_FILE = "config.yaml"


def check_same_data(folder: Path, data: Mapping[str, Any] | None) -> None:
    """A checkpoint of a dataset run continues only on the same training data: the data's
    fingerprint saved in ``folder`` must be ``data``'s (:class:`CheckpointMismatchError`
    otherwise; a checkpoint without one, or ``data`` None, is not checked)."""
    if data is None:
        return
    try:
        state = json.loads((folder / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointNotFoundError(
            f"resume: cannot read {folder / TRAINER_STATE}: {err}"
        ) from err
    saved = state.get("data") if isinstance(state, dict) else None
    if not isinstance(saved, dict) or "fingerprint" not in saved:
        return
    if saved["fingerprint"] != data.get("fingerprint"):
        raise CheckpointMismatchError(
            f"resume: {folder} was trained on other data (fingerprint {saved['fingerprint']}, "
            f"this run's {data.get('fingerprint')}): the training files or their "
            "tokenization changed"
        )


def check_resumable(folder: Path, config: TrainerConfig) -> int:
    """The step the checkpoint in ``folder`` was taken at, if ``config`` can resume from it."""
    try:
        state = json.loads((folder / TRAINER_STATE).read_text(encoding="utf-8"))
        step = int(state["global_step"])
        saved = dict(state["config"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointNotFoundError(
            f"resume: cannot read {folder / TRAINER_STATE}: {err}"
        ) from err
    now = asdict(config)
    differ = {k: (saved.get(k), now[k]) for k in _RESUME_KEYS if saved.get(k) != now[k]}
    if differ:
        detail = ", ".join(f"{k}: checkpoint {a!r}, this run {b!r}" for k, (a, b) in differ.items())
        raise CheckpointMismatchError(f"resume: {folder} does not fit this run ({detail})")
    if step >= config.total_steps:
        raise CheckpointMismatchError(
            f"resume: {folder} is at step {step}; ask for more steps than that, got "
            f"steps={config.total_steps}"
        )
    return step
