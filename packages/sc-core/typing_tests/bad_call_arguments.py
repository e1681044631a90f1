"""Wrong argument types in the plugin-free spelling: each marked line must fail."""

from __future__ import annotations

from _typing_workers import Actor, DataProto
from sc_core import LocalWorkerGroup


def misuse(wg: LocalWorkerGroup[Actor], batch: DataProto) -> None:
    # expect: mypy=arg-type pyright=reportArgumentType
    wg.call(Actor.update_actor, "not a batch")
    # expect: mypy=arg-type pyright=reportArgumentType
    wg.call(Actor.init_model, 3)
    # expect: mypy=arg-type pyright=reportArgumentType
    wg.call(Actor.init_model, "/p", strict="yes")
    # expect: mypy=arg-type pyright=reportArgumentType
    wg.method(Actor.save)(123)
    # expect: mypy=arg-type pyright=reportArgumentType
    wg.method(Actor.update_actor).options(timeout=5)(1)
    # expect: mypy=arg-type pyright=reportArgumentType
    wg.call(Actor.ping, tag=1)
