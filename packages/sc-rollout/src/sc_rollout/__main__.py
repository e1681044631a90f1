"""``python -m sc_rollout``: see ``_cli.py``."""

from __future__ import annotations

import sys

from .serving._cli import main

sys.exit(main())
