"""Wrong numbers of arguments in the plugin-free spelling: each marked line must fail."""

from __future__ import annotations

from _typing_workers import Actor, DataProto
from sc_core import LocalWorkerGroup


def misuse(wg: LocalWorkerGroup[Actor], batch: DataProto) -> None:
    # expect: mypy=call-arg pyright=reportCallIssue
    wg.call(Actor.update_actor)
    # expect: mypy=call-arg pyright=reportCallIssue
    wg.call(Actor.save, "/a", "/b")
    # expect: mypy=call-arg pyright=reportCallIssue
    wg.call(Actor.init_model, "/p", strictt=True)
    # expect: mypy=call-arg pyright=reportCallIssue
    wg.method(Actor.update_actor)(batch, batch)
