"""The extension depends on sc-dispatch and sc-core only: proven in its own nox session."""

from __future__ import annotations

import importlib.util
import os
import re
from importlib.metadata import metadata, requires

import pytest
import sc_ext_roundrobin


def test_declares_only_sc_dispatch_and_sc_core() -> None:
    names = {
        re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in requires("sc-ext-roundrobin") or []
    }
    assert names == {"sc-dispatch", "sc-core"}


def test_is_never_published() -> None:
    assert "Private :: Do Not Upload" in metadata("sc-ext-roundrobin").get_all("Classifier", [])


def test_public_api_is_exactly_all() -> None:
    public = {n for n in dir(sc_ext_roundrobin) if not n.startswith("_")}
    assert public == set(sc_ext_roundrobin.__all__) - {"__version__"}


@pytest.mark.skipif(
    os.environ.get("SC_ISOLATED_PACKAGE") != "sc-ext-roundrobin",
    reason="only meaningful in the isolated tests(sc-ext-roundrobin) nox session",
)
@pytest.mark.parametrize("name", ["torch", "numpy", "ray", "sc_protocol", "sc_ray"])
def test_nothing_else_is_installed(name: str) -> None:
    assert importlib.util.find_spec(name) is None
