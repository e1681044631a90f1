"""Misuses in the plain spelling, ``wg.method_name(...)``, caught by mypy with
``sc_core.mypy_plugin``: each marked line must fail."""

from __future__ import annotations

from _typing_workers import Actor, DataProto, PatientActor
from sc_core import LocalWorkerGroup


def misuse(wg: LocalWorkerGroup[Actor], batch: DataProto) -> None:
    # expect: mypy=arg-type
    wg.update_actor("not a batch")
    # expect: mypy=arg-type
    wg.init_model(path=3)
    # expect: mypy=arg-type
    wg.update_actor.options(timeout=5)(1)
    # expect: mypy=call-arg
    wg.update_actor()
    # expect: mypy=call-arg
    wg.save("/a", "/b")
    # expect: mypy=assignment
    out: DataProto = wg.init_model("/p")
    # expect: mypy=attr-defined
    wg.init_model("/p").meta_info = {}
    # expect: mypy=index
    wg.update_actor(batch)[0]
    # expect: mypy=attr-defined
    wg.updte_actor(batch)
    # expect: mypy=attr-defined
    wg.not_registered(1)
    # expect: mypy=attr-defined
    _ = wg.rank
    # expect: mypy=assignment
    text: str = wg.counted(3)
    del out, text


def unregistered_override(wg: LocalWorkerGroup[PatientActor]) -> None:
    # expect: mypy=attr-defined
    wg.save("/p")
