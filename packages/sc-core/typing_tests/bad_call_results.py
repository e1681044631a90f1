"""Results used as the wrong type in the plugin-free spelling: each marked line must fail.

A ``ONE_TO_ALL`` call returns a list of the method's results, never a ``DataProto``; a
``DP_COMPUTE_PROTO`` call returns the joined ``DataProto``, never a list.
"""

from __future__ import annotations

from _typing_workers import Actor, DataProto
from sc_core import LocalWorkerGroup


def misuse(wg: LocalWorkerGroup[Actor], batch: DataProto) -> None:
    # expect: mypy=assignment pyright=reportAssignmentType
    out: DataProto = wg.call(Actor.init_model, "/p")
    # expect: mypy=attr-defined pyright=reportAttributeAccessIssue
    wg.call(Actor.init_model, "/p").meta_info = {}
    # expect: mypy=index pyright=reportIndexIssue
    wg.call(Actor.update_actor, batch)[0]
    # (mypy solves the result type from the declared one first, so it blames the method)
    # expect: mypy=arg-type pyright=reportAssignmentType
    rows: list[DataProto] = wg.call(Actor.update_actor, batch)
    # expect: mypy=assignment pyright=reportAssignmentType
    name: str = wg.call(Actor.ping, "x")
    # expect: mypy=assignment pyright=reportAssignmentType
    total: int = wg.call(Actor.metrics, batch)
    del out, rows, name, total
