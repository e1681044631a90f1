"""What a worker group shares with the groups spawned from it, and what sc-core's helper
modules may use of a group.

:class:`GroupRuntime` is the one owner of a set of workers' state: the backend that runs
them, their handles and names, the rendezvous address, which ranks are dead or busy, what
their journals held when a re-attached driver asked them, and the lifecycle (closed or
not, the resource pool share, every view over the workers). A group
and its views (``spawn``, ``spawn_fused``, ``fuse``) hold the same runtime; each has its own
:class:`~sc_core._methods.MethodTable` of bound names.

:class:`GroupLike` is what the helper modules (binding, colocation, fused classes, worker
replacement) use of a group, so that none of them imports :class:`~sc_core.WorkerGroup`:
:mod:`sc_core._worker_group` imports them, never the other way round.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar, cast, overload

from ._backend import Backend
from ._call_ids import CallIds
from ._liveness import Liveness
from ._meshes import MeshCache
from ._methods import MethodTable
from ._replay import JournalView
from ._resource import ResourcePool

__all__ = ["GroupLike", "GroupRuntime", "Shared"]

T = TypeVar("T")


class GroupRuntime:
    """The state a group and its views share (see the module docstring)."""

    def __init__(self) -> None:
        self.backend: Backend | None = None
        self.workers: list[Any] = []
        self.worker_names: list[str] = []
        self.master_addr: str | None = None
        self.master_port: str | None = None
        self.liveness = Liveness()
        self.closed = False
        self.lock = threading.Lock()
        #: The pool whose share the workers hold, released once when they are closed.
        self.pool: ResourcePool | None = None
        #: Every group over these workers (the group and its views), held weakly.
        self.views: weakref.WeakSet[Any] = weakref.WeakSet()
        #: What the workers' journals held when a re-attached driver asked them
        #: (``WorkerGroup.adopt_journals``); ``None``: never asked.
        self.journals: JournalView | None = None

    @property
    def world_size(self) -> int:
        return len(self.workers)


class Shared(Generic[T]):
    """A group attribute kept in its runtime, so that every view sees one value: verl's
    ``_workers``, ``_worker_names``, ``_master_addr`` and ``_master_port``, which a
    backend's group sets."""

    def __init__(self, field: str) -> None:
        self._field = field

    @overload
    def __get__(self, group: None, owner: type) -> Shared[T]: ...

    @overload
    def __get__(self, group: object, owner: type) -> T: ...

    def __get__(self, group: object, owner: type) -> Shared[T] | T:
        if group is None:
            return self
        return cast(T, getattr(cast(Any, group)._sc_runtime, self._field))

    def __set__(self, group: object, value: T) -> None:
        setattr(cast(Any, group)._sc_runtime, self._field, value)


class GroupLike(Protocol):
    """What sc-core's helper modules use of a worker group (a
    :class:`~sc_core.WorkerGroup` meets it)."""

    name_prefix: str
    default_timeout: float | None
    fused_worker_used: bool
    wg_dict: dict[str, Any] | None
    _sc_runtime: GroupRuntime
    _sc_call_ids: CallIds | None
    _sc_methods: MethodTable
    _user_defined_cls: type | None
    _fused_role: str | None
    _spawned_from: Any
    _mesh_cache: MeshCache

    @property
    def world_size(self) -> int: ...

    @property
    def dead_ranks(self) -> list[int]: ...

    @property
    def bound_method_names(self) -> list[str]: ...

    def _sc_backend(self, method_name: str) -> Backend: ...

    def check_worker_aliveness(self) -> list[int]: ...

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def spawn(self, prefix_set: Iterable[str]) -> dict[str, Any]: ...
