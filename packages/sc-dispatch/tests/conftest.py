"""Shared set-up for the sc-dispatch tests.

pytest runs with ``--import-mode=importlib``, which leaves ``sys.path`` alone, so the test
modules could not import their shared helpers (``_dispatch_fakes``) by name. This directory
is put on ``sys.path`` once, here, before any test module is imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
