"""sc-dispatch's two tiers: the top level is what a worker class and its caller write;
``sc_dispatch.ext`` (the extender tier) and ``sc_dispatch.verl`` (verl's names) hold the rest.
Each public module keeps the contract of ``sc_dispatch._public``."""

from __future__ import annotations

import pickle

import sc_dispatch
from sc_dispatch import _public, ext, verl

PUBLIC_MODULES = ["sc_dispatch", "sc_dispatch.ext", "sc_dispatch.testing", "sc_dispatch.verl"]


def test_these_are_the_public_modules() -> None:
    assert _public.public_modules("sc_dispatch") == PUBLIC_MODULES


def test_each_public_module_keeps_the_contract() -> None:
    # __all__ sorted and defined; every exported class and function names the public module
    # that exports it as its __module__, pickles by reference and resolves its annotations
    assert _public.problems(PUBLIC_MODULES) == []


def test_the_top_level_is_small() -> None:
    assert len(sc_dispatch.__all__) <= 30
    assert sc_dispatch.register.__module__ == "sc_dispatch"
    assert ext.WorkPlan.__module__ == "sc_dispatch.ext"
    assert verl.dispatch_one_to_all.__module__ == "sc_dispatch.verl"


def test_no_name_has_two_homes_except_the_verl_drop_in() -> None:
    tiers = [set(sc_dispatch.__all__), set(ext.__all__), set(verl.__all__)]
    shared = {n for i, a in enumerate(tiers) for b in tiers[i + 1 :] for n in a & b}
    # sc_dispatch.verl repeats what verl's decorator module offers (the same objects), so
    # that a module-alias import migrates by one line; MAGIC_ATTR, a string, is also in ext
    drop_in = {
        "Dispatch",
        "Execute",
        "MAGIC_ATTR",
        "make_nd_compute_dataproto_dispatch_fn",
        "register",
        "register_dispatch_mode",
        "update_dispatch_mode",
    }
    assert shared == drop_in
    for name in drop_in - {"MAGIC_ATTR"}:
        assert getattr(verl, name) is getattr(sc_dispatch, name)


def test_the_settings_framework_is_private() -> None:
    for module in (sc_dispatch, ext, verl):
        assert not {"Setting", "SETTINGS", "SettingValueError", "parse_bool"} & set(dir(module))


def test_a_dispatch_member_and_a_plan_pickle_by_their_public_path() -> None:
    plan_pickle = pickle.dumps(ext.Slot((0, 1), 1))
    assert b"sc_dispatch.ext" in plan_pickle
    assert pickle.loads(plan_pickle) == ext.Slot((0, 1), 1)
    assert pickle.loads(pickle.dumps(sc_dispatch.Dispatch.DP_COMPUTE_PROTO)) is (
        sc_dispatch.Dispatch.DP_COMPUTE_PROTO
    )
