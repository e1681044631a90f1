"""Shared set-up for the integration tests.

pytest runs with ``--import-mode=importlib``, which leaves ``sys.path`` alone; the re-attach
tests start ``_integration_driver.py`` from this directory as a script. Workers and drivers
run with the interpreter of the test process (not through ``uv run``): Ray reads
``RAY_ENABLE_UV_RUN_RUNTIME_ENV`` when it is first imported.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
