"""The MLflow tracker: a run in a local file store under ``<output_dir>/mlruns``.

The tracking URI is ``MLFLOW_TRACKING_URI`` when the user set it, else the file store
``file://<output_dir>/mlruns`` (``mlflow ui --backend-store-uri <output_dir>/mlruns`` shows
it). MLflow 3 keeps that store in maintenance mode and refuses it unless
``MLFLOW_ALLOW_FILE_STORE`` is true: the tracker sets it (when it is unset) for its own store,
and, for that local store, turns MLflow's usage telemetry off unless
``MLFLOW_DISABLE_TELEMETRY`` or ``DO_NOT_TRACK`` is set (read when MLflow is first imported),
so that nothing goes over the network.

The run is named ``experiment_name`` in the experiment ``project_name`` (created when
missing). Its parameters are the configuration flattened (``{"a": {"b": 1}}`` is ``a.b``),
each value as text cut to :data:`MAX_PARAM_VALUE` characters. MLflow names (metric and
parameter keys) may hold only ASCII letters, digits, ``_ - . /`` and spaces (colons only
off Windows) and no ``.``/``..`` path parts, in at most :data:`MAX_KEY` characters:
:func:`mlflow_key` writes any other character as ``_`` and drops empty path parts, so
``train/reward`` stays as it is and ``timing/gen[0]`` is ``timing/gen_0_``.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .._errors import TrainerConfigError
from ._extras import missing_extra
from ._values import plain, scalar_metrics

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

__all__ = [
    "MAX_KEY",
    "MAX_PARAM_VALUE",
    "MLFLOW_DIR",
    "MlflowTracker",
    "flat_params",
    "load_mlflow",
    "mlflow_key",
]

logger = logging.getLogger(__name__)

#: The folder of the local file store, in the output folder.
MLFLOW_DIR = "mlruns"
#: The longest metric or parameter key MLflow takes.
MAX_KEY = 250
#: The longest parameter value MLflow takes (6000 since MLflow 2.x; longer values are cut).
MAX_PARAM_VALUE = 6000
#: Most parameters, and most metrics, in one ``log_batch`` call.
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000

_BAD_CHARACTER = re.compile(r"[^A-Za-z0-9_\-. /]")


def load_mlflow() -> ModuleType:
    """The ``mlflow`` module, with ``mlflow.entities`` and ``mlflow.tracking`` imported: the
    extra ``sc-trainer[mlflow]`` (:class:`MissingExtraError` otherwise)."""
    try:  # imported late: only a run that asks for this tracker needs the extra
        import mlflow
        import mlflow.entities
        import mlflow.tracking
    except ImportError as err:
        raise missing_extra("mlflow", "mlflow", "mlflow", err) from err
    module: ModuleType = mlflow
    return module


def mlflow_key(name: str) -> str:
    """``name`` as a valid MLflow metric or parameter key (see the module docstring): other
    characters as ``_`` (colons too, so that a name means the same on every platform),
    ``.``/``..`` and empty path parts dropped, at most :data:`MAX_KEY` characters."""
    parts = [_BAD_CHARACTER.sub("_", part) for part in name.split("/")]
    key = "/".join(p for p in parts if p not in ("", ".", ".."))
    return key[:MAX_KEY].rstrip("/") or "_"


def _flatten(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping) and value:
        for key, inner in value.items():
            yield from _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def flat_params(config: Mapping[str, Any]) -> dict[str, str]:
    """``config`` as MLflow parameters: nested mappings flattened with ``.``, each key made
    valid (:func:`mlflow_key`), each value as text (lists as JSON-like text) cut to
    :data:`MAX_PARAM_VALUE` characters; of two keys that end up the same, the first is kept."""
    params: dict[str, str] = {}
    for raw, value in _flatten(plain(config), ""):
        key = mlflow_key(raw or "config")
        if key in params:
            logger.warning(
                "mlflow: parameter %r is logged as %r, which is taken; skipped", raw, key
            )
            continue
        params[key] = str(value)[:MAX_PARAM_VALUE]
    return params


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MlflowTracker:
    """Logs each step's numbers as metrics of one MLflow run at the step, keys made valid by
    :func:`mlflow_key` (the first name of two that end up the same is kept)."""

    def __init__(
        self,
        output_dir: Path,
        *,
        project_name: str,
        experiment_name: str,
        config: Mapping[str, Any],
    ) -> None:
        user_uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
        if not user_uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            if "DO_NOT_TRACK" not in os.environ:
                os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        mlflow = load_mlflow()
        self._entities = mlflow.entities
        if user_uri:
            self.tracking_uri = user_uri
        else:
            store = output_dir / MLFLOW_DIR
            store.mkdir(parents=True, exist_ok=True)
            self.tracking_uri = store.resolve().as_uri()
        self._client: MlflowClient = mlflow.tracking.MlflowClient(tracking_uri=self.tracking_uri)
        experiment = self._client.get_experiment_by_name(project_name)
        if experiment is None:
            experiment_id = self._client.create_experiment(project_name)
        elif experiment.lifecycle_stage == "deleted":
            raise TrainerConfigError(
                f"mlflow: the experiment {project_name!r} (project_name) is deleted in "
                f"{self.tracking_uri}; restore it, or choose another project name"
            )
        else:
            experiment_id = experiment.experiment_id
        run = self._client.create_run(experiment_id, run_name=experiment_name)
        self.run_id: str = run.info.run_id
        params = [self._entities.Param(k, v) for k, v in flat_params(config).items()]
        try:
            for batch in _chunks(params, _PARAMS_PER_BATCH):
                self._client.log_batch(self.run_id, params=list(batch))
        except BaseException:
            self._client.set_terminated(self.run_id, status="FAILED")
            raise
        self._keys: dict[str, str] = {}  # metric name -> its MLflow key
        self._taken: dict[str, str] = {}  # MLflow key -> the metric name it is for

    def _key(self, name: str) -> str | None:
        """The MLflow key of metric ``name``, or ``None`` when another name has it."""
        key = self._keys.get(name)
        if key is None:
            key = self._keys[name] = mlflow_key(name)
            owner = self._taken.setdefault(key, name)
            if owner != name:
                logger.warning("mlflow: metric %r would be %r, as %r is; skipped", name, key, owner)
            elif key != name:
                logger.info("mlflow: metric %r is logged as %r", name, key)
        return key if self._taken[key] == name else None

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        now_ms = int(time.time() * 1000)
        entries = [
            self._entities.Metric(key, float(value), now_ms, step)
            for name, value in scalar_metrics(metrics).items()
            if (key := self._key(name)) is not None
        ]
        for batch in _chunks(entries, _METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=list(batch))

    def close(self) -> None:
        self._client.set_terminated(self.run_id)
