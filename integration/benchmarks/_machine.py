"""What every benchmark records about the machine it ran on (its JSON "machine" entry), and
how it writes its result file."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
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


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write a benchmark's ``result`` as indented JSON to ``path`` (folders made) and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
