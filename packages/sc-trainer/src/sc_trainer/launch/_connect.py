"""Connecting a driver to a standing Ray cluster the way its operator started it.

Ray 2.59 and later start a cluster with token authentication by default (``ray start
--head``, and ``ray.init()`` of a local one): the cluster's control plane refuses a driver
that does not send the cluster's token, and a driver sends it only when ``RAY_AUTH_MODE=token``
was set *before* Python imported Ray. :func:`connect_to_cluster` therefore decides the mode
before the import: a driver that has a token (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, or
the ``~/.ray/auth_token`` that ``ray start`` and ``ray.init`` write) connects with it, which a
cluster without authentication accepts too; ``RAY_AUTH_MODE`` set by the user wins. When the
connection still fails, :class:`ClusterConnectError` says what to set, instead of Ray's retry
loop ending in a bare ``ConnectionError``.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from .._errors import ClusterConnectError

__all__ = [
    "auth_token_source",
    "connect_to_cluster",
    "prepare_ray_auth",
    "prepare_ray_environment",
]

logger = logging.getLogger(__name__)

#: where ``ray start`` and ``ray.init`` keep the cluster's token (``ray get-auth-token``)
DEFAULT_TOKEN_PATH = Path("~/.ray/auth_token")


def auth_token_source() -> str | None:
    """Where this process would read a Ray token from (an environment variable or a file),
    or ``None`` when it has none."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return f"RAY_AUTH_TOKEN_PATH={path}"
    default = DEFAULT_TOKEN_PATH.expanduser()
    return str(default) if default.is_file() else None


def prepare_ray_auth() -> str:
    """Set ``RAY_AUTH_MODE`` for the Ray import to come (see the module's documentation);
    returns the mode the driver will use. Ray reads it when it is first imported: once Ray
    is imported nothing is changed."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode:
        return mode
    if "ray" in sys.modules:
        return "disabled"  # too late to change; connect_to_cluster explains a refusal
    if auth_token_source() is not None:
        os.environ["RAY_AUTH_MODE"] = "token"
        return "token"
    return "disabled"


def prepare_ray_environment() -> str:
    """What a driver sets before it first imports Ray (or anything that imports it, such as
    sc-ray): ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0`` (the workers run in the driver's
    environment as it is, not one ``uv run`` rebuilds) and ``RAY_AUTH_MODE``
    (:func:`prepare_ray_auth`, whose mode it returns). Call it before ``import sc_ray``."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    return prepare_ray_auth()


def _reachable(address: str, timeout_s: float = 5.0) -> bool:
    """Whether something listens at ``host:port``."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return True  # not host:port (e.g. "auto"): let Ray resolve it
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def connect_to_cluster(address: str | None, *, namespace: str, log_to_driver: bool) -> Any:
    """``ray.init`` on the standing cluster at ``address`` (``None``: ``RAY_ADDRESS`` or a
    cluster started on this machine) in ``namespace``; returns the ``ray`` module.
    :class:`ClusterConnectError` names the address and what to set when it cannot connect."""
    mode = prepare_ray_environment()
    import ray

    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    if target != "auto" and not _reachable(target):
        raise ClusterConnectError(
            f"no Ray cluster answers at {target}: start one there (ray start --head "
            f"--port={target.rpartition(':')[2]}) or give its address (--address, RAY_ADDRESS)"
        )
    try:
        ray.init(address=target, namespace=namespace, log_to_driver=log_to_driver)
    except ConnectionError as err:
        source = auth_token_source()
        raise ClusterConnectError(
            f"cannot connect to the Ray cluster at {target} (this driver's RAY_AUTH_MODE: "
            f"{mode}; token: {source or 'none'}): {err}. A cluster started with token "
            "authentication (Ray's default for `ray start --head` since 2.59) needs, in the "
            "driver's environment before Python imports Ray, RAY_AUTH_MODE=token and the "
            "cluster's token: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token "
            "(`ray get-auth-token` on the cluster's head prints it)"
        ) from err
    logger.info("connected to the Ray cluster at %s (auth mode %s)", target, mode)
    return ray
