"""Every environment variable sc-rollout reads, declared once (see ``sc_dispatch._setting``).

Each is read where an argument was left at ``None``: an explicit argument always wins.
"""

from __future__ import annotations

from sc_dispatch._setting import Setting, parse_seconds, parse_str

__all__ = [
    "HEALTH_TIMEOUT",
    "HOST",
    "REQUEST_TIMEOUT",
    "SETTINGS",
    "START_TIMEOUT",
    "VLLM_ENV",
    "VLLM_START_TIMEOUT",
]

HOST: Setting[str] = Setting(
    "SC_ROLLOUT_HOST",
    parse_str,
    "127.0.0.1",
    "the address a rollout server binds when it is given none (the node's address on a "
    "cluster); all interfaces (0.0.0.0, ::) are refused",
)
REQUEST_TIMEOUT: Setting[float] = Setting(
    "SC_ROLLOUT_REQUEST_TIMEOUT_S",
    parse_seconds,
    600.0,
    "deadline of one generation request sent to a rollout server (RolloutClient, Router)",
)
HEALTH_TIMEOUT: Setting[float] = Setting(
    "SC_ROLLOUT_HEALTH_TIMEOUT_S",
    parse_seconds,
    5.0,
    "deadline of one health check or control call (abort, pause, weights) of a rollout server",
)
START_TIMEOUT: Setting[float] = Setting(
    "SC_ROLLOUT_START_TIMEOUT_S",
    parse_seconds,
    300.0,
    "how long a server process may take to be ready, a restarted server to be healthy again, "
    "and a router request to wait for a live server",
)

VLLM_ENV: Setting[str] = Setting(
    "SC_ROLLOUT_VLLM_ENV",
    parse_str,
    "",
    "the folder of the vLLM environment (made by `python -m sc_rollout vllm-env create`); "
    "empty: a folder per pin under the user's cache folder (~/.cache/sc)",
)
VLLM_START_TIMEOUT: Setting[float] = Setting(
    "SC_ROLLOUT_VLLM_START_TIMEOUT_S",
    parse_seconds,
    900.0,
    "how long a vLLM server process may take to be ready (vLLM imports itself in three "
    "processes and warms up: minutes on a busy CPU)",
)

SETTINGS: tuple[Setting[object], ...] = (
    HOST,
    REQUEST_TIMEOUT,
    HEALTH_TIMEOUT,
    START_TIMEOUT,
    VLLM_ENV,
    VLLM_START_TIMEOUT,
)
