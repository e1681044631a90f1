"""Worker classes for the typing cases: one method per kind of call the checkers must type.

``DataProto`` is a stand-in (sc-protocol is not installed in the ``typing`` session): any
class works the same, since a mode's collected type only depends on the method's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sc_core import ClassWithInitArgs, LocalWorkerGroup, ResourcePool, Worker
from sc_dispatch import (
    CollectsList,
    Dispatch,
    Execute,
    make_nd_compute_dataproto_dispatch_fn,
    register,
    register_dispatch_mode,
)


class DataProto:
    """Stand-in for sc_protocol.DataProto."""

    def __init__(self, rows: int = 0) -> None:
        self.rows = rows
        self.meta_info: dict[str, Any] = {}

    def __len__(self) -> int:
        return self.rows


def _dispatch_twice(worker_group: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    n = worker_group.world_size
    return tuple([a, a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def _collect_flat(worker_group: Any, outputs: Any) -> Any:
    return [x for out in outputs for x in out]


def _collect_count(worker_group: Any, outputs: Any) -> int:
    return len(outputs)


#: A custom mode declared to collect a list of the method's results.
EVERY_RANK = CollectsList(
    register_dispatch_mode("TYPING_EVERY_RANK", _dispatch_twice, _collect_flat)
)


class Actor(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, path: str, *, strict: bool = True) -> int:
        return len(path)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, batch: DataProto) -> DataProto:
        return batch

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, func: Callable[[DataProto], DataProto], batch: DataProto) -> DataProto:
        return func(batch)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def metrics(self, batch: DataProto) -> dict[str, float]:
        return {"loss": 0.0}

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def save(self, path: str) -> str:
        return path

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def per_rank(self, seed: int) -> float:
        return float(seed)

    @register()
    def default_mode(self, value: int) -> int:
        return value

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def ping(self, tag: str) -> str:
        return tag

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def generate(self, batch: DataProto) -> DataProto:
        return batch

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def compute_log_prob(self, batch: DataProto) -> DataProto:
        return batch

    @register(dispatch_mode=EVERY_RANK)
    def custom(self, n: int) -> str:
        return str(n)

    @register(dispatch_mode={"dispatch_fn": _dispatch_twice, "collect_fn": _collect_count})
    def counted(self, n: int) -> str:
        return str(n)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def explicit_execute(self, n: int) -> int:
        return n

    def not_registered(self, n: int) -> int:
        return n


class PatientActor(Actor):
    """Overrides registered methods with the same modes, as subclasses of workers do."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, batch: DataProto) -> DataProto:
        return batch

    def save(self, path: str) -> str:  # not registered: a group of this class has no "save"
        return path


def identity(batch: DataProto) -> DataProto:
    return batch


def make_group() -> LocalWorkerGroup[Actor]:
    return LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(Actor))
