"""Replacing a file atomically, and cleaning up after saves that died half-way.

:func:`write_atomically` writes to a temporary file in the target directory (named
``.sc-protocol-<host>-<pid>-<token>.tmp``, created with the usual umask permissions),
flushes and syncs it, and renames it over the target, so that readers see the old file or
the new one, never a part. A writer killed half-way leaves its temporary behind; the next
write into the same directory removes the temporaries of this naming scheme whose process
(on this host) is gone. What goes into the file is the caller's business (:mod:`._serialize`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import socket
from collections.abc import Callable
from typing import BinaryIO

__all__ = ["remove_stale_temporaries", "write_atomically"]

logger = logging.getLogger("sc_protocol")

_HOST = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
_TMP = re.compile(r"^\.sc-protocol-(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-[0-9a-f]+\.tmp$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remove_stale_temporaries(directory: str) -> list[str]:
    """Remove the temporary files that saves by dead processes of this host left in
    ``directory``; returns their names."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        match = _TMP.match(name)
        if match is None or match["host"] != _HOST:
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _pid_alive(pid):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
            removed.append(name)
            logger.info("removed %s, left by an interrupted save of process %d", name, pid)
    return removed


def write_atomically(path: str, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write`` on a temporary file next to ``path``, then rename it over ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    remove_stale_temporaries(directory)
    tmp = os.path.join(directory, f".sc-protocol-{_HOST}-{os.getpid()}-{secrets.token_hex(6)}.tmp")
    # Mode 0o666 minus the umask, as for any file this process creates (mkstemp uses 0o600).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
