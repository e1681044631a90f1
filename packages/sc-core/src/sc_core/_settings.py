"""Every environment variable sc-core reads, declared once (see ``sc_dispatch._setting``).

Worker-side variables (the rendezvous ones) are read from the worker's own environment
(:func:`sc_core.worker_environ`); the others from the driver's ``os.environ``.
"""

from __future__ import annotations

from pathlib import Path

from sc_dispatch._setting import Setting, parse_bool, parse_path, parse_seconds, parse_str

__all__ = [
    "ABORT_ON_WORKER_DEATH",
    "CALL_TIMEOUT",
    "LOCAL_INLINE",
    "RENDEZVOUS",
    "RENDEZVOUS_TIMEOUT",
    "SETTINGS",
    "TRACE_FILE",
    "WORKER_START_TIMEOUT",
]

TRACE_FILE: Setting[Path | None] = Setting(
    "SC_CORE_TRACE_FILE",
    parse_path,
    None,
    "record every call of the process (from import) and write a Chrome trace there at exit",
)
CALL_TIMEOUT: Setting[float | None] = Setting(
    "SC_CORE_CALL_TIMEOUT_S",
    parse_seconds,
    None,
    "default deadline of every call of a worker group built without default_timeout "
    "(unset: no deadline)",
)
WORKER_START_TIMEOUT: Setting[float] = Setting(
    "SC_CORE_WORKER_START_TIMEOUT_S",
    parse_seconds,
    300.0,
    "how long start_worker_aliveness_check waits for every worker to be alive",
)
ABORT_ON_WORKER_DEATH: Setting[bool] = Setting(
    "SC_CORE_ABORT_ON_WORKER_DEATH",
    parse_bool,
    False,
    "the aliveness check kills the driver with SIGABRT when a worker dies, as verl does",
)
LOCAL_INLINE: Setting[bool] = Setting(
    "SC_CORE_LOCAL_INLINE",
    parse_bool,
    False,
    "LocalWorkerGroup runs every call on the calling thread (for breakpoints), without deadlines",
)
RENDEZVOUS: Setting[str | None] = Setting(
    "SC_RENDEZVOUS",
    parse_str,
    None,
    "worker side: 'package.module:factory' building the rendezvous of a worker process. "
    "Code from the environment, so backends reserve it: sc-ray refuses it in worker_env",
)
RENDEZVOUS_TIMEOUT: Setting[float] = Setting(
    "SC_CORE_RENDEZVOUS_TIMEOUT_S",
    parse_seconds,
    300.0,
    "worker side: how long a rank waits for rank 0 to publish MASTER_ADDR/MASTER_PORT",
)

SETTINGS: tuple[Setting[object], ...] = (
    TRACE_FILE,
    CALL_TIMEOUT,
    WORKER_START_TIMEOUT,
    ABORT_ON_WORKER_DEATH,
    LOCAL_INLINE,
    RENDEZVOUS,
    RENDEZVOUS_TIMEOUT,
)
