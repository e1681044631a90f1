"""``free_port``: the one way sc picks a TCP port for a rendezvous, a server or a cluster."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "") -> int:
    """A TCP port free on ``host`` when asked (``""``: every interface of this node; an IPv6
    address binds an IPv6 socket). Another process may take it before the caller binds it,
    so a caller that cannot retry should bind the socket itself instead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
