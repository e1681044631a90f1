"""``ResourcePool`` (how many workers on which node) and ``ClassWithInitArgs``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ._errors import InvalidConfigError, ResourcePoolError

__all__ = ["ClassWithInitArgs", "ResourcePool"]

T = TypeVar("T")


def _positive_int(method: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ResourcePoolError(
            f"{method}: {name} must be a positive int, got {type(value).__qualname__} {value!r}"
        )
    if value < 1:
        raise ResourcePoolError(f"{method}: {name} must be positive, got {value}")
    return value


class ResourcePool:
    """The processes of a worker group, per node.

    ``process_on_nodes[i]`` workers run on node ``i``; global ranks are numbered node by
    node. ``max_colocate_count`` is how many worker groups may share one device (the Ray
    backend sizes its placement bundles with it); ``n_gpus_per_node`` is the node's device
    count. ``process_on_nodes=None`` starts empty for :meth:`add_node`; an empty list, or a
    zero or negative count, is a :class:`~sc_core.ResourcePoolError`.
    """

    def __init__(
        self,
        process_on_nodes: Sequence[int] | None = None,
        max_colocate_count: int = 10,
        n_gpus_per_node: int = 8,
    ) -> None:
        self._store: list[int] = []
        #: How many open worker groups use the pool (see _sc_acquire / _sc_release_user).
        self._sc_users = 0
        if process_on_nodes is not None:
            if isinstance(process_on_nodes, (str, bytes)) or not isinstance(
                process_on_nodes, Sequence
            ):
                raise ResourcePoolError(
                    f"ResourcePool: process_on_nodes must be a sequence of ints, "
                    f"got {type(process_on_nodes).__qualname__} {process_on_nodes!r}"
                )
            if len(process_on_nodes) == 0:
                raise ResourcePoolError(
                    "ResourcePool: process_on_nodes is empty; give one process count per node"
                )
            for i, count in enumerate(process_on_nodes):
                self._store.append(_positive_int("ResourcePool", f"process_on_nodes[{i}]", count))
        self.max_colocate_count = _positive_int(
            "ResourcePool", "max_colocate_count", max_colocate_count
        )
        self.n_gpus_per_node = _positive_int("ResourcePool", "n_gpus_per_node", n_gpus_per_node)

    def _sc_acquire(self) -> None:
        """A worker group starts using the pool."""
        self._sc_users += 1

    def _sc_release_user(self) -> None:
        """A worker group stopped using the pool (it was closed); the last one releases it."""
        self._sc_users = max(0, self._sc_users - 1)
        if self._sc_users == 0:
            self.release()

    def release(self) -> None:
        """Free what the pool holds (nothing for an in-process pool; a Ray pool removes its
        placement groups). Called when the last worker group using the pool is closed."""

    def add_node(self, process_count: int) -> None:
        """Append a node running ``process_count`` workers."""
        self._store.append(_positive_int("ResourcePool.add_node", "process_count", process_count))

    @property
    def store(self) -> list[int]:
        """The process count of each node (a copy)."""
        return list(self._store)

    def __call__(self) -> list[int]:
        """verl's spelling of :attr:`store`."""
        return self.store

    @property
    def world_size(self) -> int:
        """The total number of workers."""
        return sum(self._store)

    def local_world_size_list(self) -> list[int]:
        """For every global rank, the number of workers on its node."""
        return [count for count in self._store for _ in range(count)]

    def local_rank_list(self) -> list[int]:
        """For every global rank, its rank among the workers of its node."""
        return [local for count in self._store for local in range(count)]

    def __repr__(self) -> str:
        return (
            f"ResourcePool(process_on_nodes={self._store}, "
            f"max_colocate_count={self.max_colocate_count}, "
            f"n_gpus_per_node={self.n_gpus_per_node})"
        )


class ClassWithInitArgs(Generic[T]):
    """A worker class with the arguments to construct it later, once per rank.

    ``ClassWithInitArgs(cls, *args, **kwargs)()`` builds ``cls(*args, **kwargs)``.
    """

    def __init__(self, cls: Callable[..., T], *args: Any, **kwargs: Any) -> None:
        if not callable(cls):
            raise InvalidConfigError(
                f"ClassWithInitArgs: cls must be a class, got {type(cls).__qualname__} {cls!r}"
            )
        self.cls = cls
        self.args = args
        self.kwargs = kwargs
        self.fused_worker_used = False

    def __call__(self) -> T:
        return self.cls(*self.args, **self.kwargs)

    def __repr__(self) -> str:
        name = getattr(self.cls, "__qualname__", repr(self.cls))
        return f"ClassWithInitArgs({name}, args={self.args!r}, kwargs={self.kwargs!r})"
