"""Shared set-up for the sc-rollout tests.

pytest runs with ``--import-mode=importlib``, which leaves ``sys.path`` alone; this directory
is put on ``sys.path`` here so the test modules can import their helpers
(``_rollout_helpers``).
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
