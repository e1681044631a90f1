"""Every environment variable sc-trainer reads (see :class:`sc_dispatch._setting.Setting`)."""

from __future__ import annotations

from sc_dispatch._setting import Setting, parse_bool, parse_seconds

__all__ = ["LOST_PEER_GRACE", "SETTINGS", "WORKER_LOGS"]

WORKER_LOGS: Setting[bool] = Setting(
    "SC_TRAINER_WORKER_LOGS",
    parse_bool,
    False,
    "sc-demo and the trainer on Ray forward the workers' output to the terminal",
)

LOST_PEER_GRACE: Setting[float] = Setting(
    "SC_TRAINER_LOST_PEER_GRACE_S",
    parse_seconds,
    60.0,
    "how long a recovery waits for the cluster to report a worker dead when a survivor's "
    "collective lost its connection to a peer (a lost node is declared dead only after Ray's "
    "health checks fail, about 15 to 30 s by default)",
)

SETTINGS: tuple[Setting[object], ...] = (WORKER_LOGS, LOST_PEER_GRACE)
