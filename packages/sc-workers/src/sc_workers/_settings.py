"""Every environment variable sc-workers reads, declared once (see ``sc_dispatch._setting``).

All are read on the worker, from the worker's own environment (:func:`sc_core.worker_environ`).
"""

from __future__ import annotations

from sc_dispatch._setting import Setting, parse_seconds, parse_str

__all__ = ["DEVICE", "PG_TIMEOUT", "PIPELINE_TIMEOUT", "SETTINGS"]

DEVICE: Setting[str | None] = Setting(
    "SC_WORKERS_DEVICE",
    parse_str,
    None,
    "worker side: 'auto', 'cpu' or 'cuda', overriding the configured device",
)
PG_TIMEOUT: Setting[float] = Setting(
    "SC_WORKERS_PG_TIMEOUT_S",
    parse_seconds,
    600.0,
    "worker side: how long a torch.distributed collective may block before it fails",
)

PIPELINE_TIMEOUT: Setting[float] = Setting(
    "SC_WORKERS_PIPELINE_TIMEOUT_S",
    parse_seconds,
    300.0,
    "worker side: how long a pipeline stage may wait for its neighbour's activations or "
    "gradients before the step fails (a stage that raises tears the pipeline down at once)",
)

SETTINGS: tuple[Setting[object], ...] = (DEVICE, PG_TIMEOUT, PIPELINE_TIMEOUT)
