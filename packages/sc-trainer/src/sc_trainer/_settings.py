"""Every environment variable sc-trainer reads (see :class:`sc_dispatch._setting.Setting`)."""

from __future__ import annotations

from sc_dispatch._setting import Setting, parse_bool

__all__ = ["SETTINGS", "WORKER_LOGS"]

WORKER_LOGS: Setting[bool] = Setting(
    "SC_TRAINER_WORKER_LOGS",
    parse_bool,
    False,
    "sc-demo and the trainer on Ray forward the workers' output to the terminal",
)

SETTINGS: tuple[Setting[object], ...] = (WORKER_LOGS,)
