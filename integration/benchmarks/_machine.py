"""What every benchmark records about the machine it ran on (its JSON "machine" entry)."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def machine(**extra: Any) -> dict[str, Any]:
    """CPU count, Python, platform and load average now, plus ``extra`` (library versions)."""
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "loadavg_at_start": list(os.getloadavg()),
        **extra,
    }
