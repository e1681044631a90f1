"""Shared set-up for the sc-workers tests.

pytest runs with ``--import-mode=importlib``, which leaves ``sys.path`` alone; this directory
is put on it so that test modules (and the processes they spawn) import ``_workers_helpers``.
Torch uses one thread: the test machines are small and results must not depend on it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

torch.set_num_threads(1)
