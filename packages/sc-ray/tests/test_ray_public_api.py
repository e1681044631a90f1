"""sc-ray's public module keeps the contract of ``sc_dispatch._public``: ``__all__`` sorted,
and each exported class and function names ``sc_ray`` as its ``__module__`` (Ray pickles
them by reference there)."""

from __future__ import annotations

import sc_ray
from sc_dispatch import _public


def test_sc_ray_is_the_one_public_module() -> None:
    assert _public.public_modules("sc_ray") == ["sc_ray"]


def test_it_keeps_the_contract() -> None:
    assert _public.problems(["sc_ray"]) == []
    assert sc_ray.RayWorkerGroup.__module__ == "sc_ray"
