"""Shared set-up for the integration tests.

pytest runs with ``--import-mode=importlib``, which leaves ``sys.path`` alone, so the test
modules could not import their shared helpers (``_integration_runs``) by name. This directory
is put on ``sys.path`` once, here, before any test module is imported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# Workers run with the interpreter of the test process (not through `uv run`); Ray reads this
# when it is first imported.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
