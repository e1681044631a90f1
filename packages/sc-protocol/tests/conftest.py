"""Shared set-up for the sc-protocol tests.

pytest runs with ``--import-mode=importlib``, which leaves ``sys.path`` alone; this directory
is put on ``sys.path`` here so that the test modules can import ``_protocol_helpers``.
Every test starts with the global padding switches unset.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from sc_protocol import SETTINGS, DataProtoConfig  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for setting in SETTINGS:
        for name in setting.names:
            monkeypatch.delenv(name, raising=False)
    DataProtoConfig.auto_padding = None
    DataProtoConfig.copy_readonly_buffers = None
    yield
    DataProtoConfig.auto_padding = None
    DataProtoConfig.copy_readonly_buffers = None
