"""sc-dispatch depends on the standard library only: proven in its own nox session."""

from __future__ import annotations

import importlib.util
import os
import types

import pytest
import sc_dispatch


@pytest.mark.skipif(
    os.environ.get("SC_ISOLATED_PACKAGE") != "sc-dispatch",
    reason="only meaningful in the isolated tests(sc-dispatch) nox session",
)
@pytest.mark.parametrize("name", ["torch", "numpy", "ray", "tensordict"])
def test_heavy_dependencies_are_not_installed(name: str) -> None:
    assert importlib.util.find_spec(name) is None


def test_declares_no_dependencies() -> None:
    from importlib.metadata import requires, version

    assert version("sc-dispatch") == sc_dispatch.__version__
    assert not requires("sc-dispatch")


def test_public_api_is_exactly_all() -> None:
    public = {n for n in dir(sc_dispatch) if not n.startswith("_")}
    modules = {n for n in public if isinstance(getattr(sc_dispatch, n), types.ModuleType)}
    exported = set(sc_dispatch.__all__)
    assert exported - {"__version__"} <= public
    # Every public name is exported; the public modules are not names of the top level:
    # the second tiers (ext, verl) are imported with it, sc_dispatch.testing only on request.
    assert public - exported == modules
    assert {"ext", "verl"} <= modules <= {"ext", "verl", "testing"}
