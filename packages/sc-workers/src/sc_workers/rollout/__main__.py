"""``python -m sc_workers.rollout``: see ``_cli.py``."""

from __future__ import annotations

import sys

from ._cli import main

sys.exit(main())
