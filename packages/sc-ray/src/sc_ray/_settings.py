"""Every environment variable sc-ray reads, declared once (see ``sc_dispatch._setting``).

sc-ray also honours sc-core's (``sc_core.SETTINGS``): the call deadline, the aliveness check.
"""

from __future__ import annotations

import sc_core
from sc_dispatch._setting import Setting, parse_seconds

__all__ = ["CORE_RENDEZVOUS", "PLACEMENT_TIMEOUT", "SETTINGS", "WORKER_START_TIMEOUT"]

#: sc-core's worker-side rendezvous variable (code from the environment), which sc-ray sets
#: itself and refuses in ``worker_env`` / ``runtime_env``.
CORE_RENDEZVOUS: Setting[object] = next(s for s in sc_core.SETTINGS if s.name == "SC_RENDEZVOUS")

PLACEMENT_TIMEOUT: Setting[float] = Setting(
    "SC_RAY_PLACEMENT_TIMEOUT_S",
    parse_seconds,
    300.0,
    "how long a pool waits for its placement groups when it was built without placement_timeout_s",
)
WORKER_START_TIMEOUT: Setting[float | None] = Setting(
    "SC_RAY_WORKER_START_TIMEOUT_S",
    parse_seconds,
    None,
    "how long RayWorkerGroup waits for its workers' constructors when built without "
    "start_timeout (unset: ray_wait_register_center_timeout, 300)",
)

SETTINGS: tuple[Setting[object], ...] = (PLACEMENT_TIMEOUT, WORKER_START_TIMEOUT)
