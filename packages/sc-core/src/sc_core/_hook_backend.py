"""sc-core 0.1's backend hooks, adapted to the :class:`~sc_core.Backend` contract.

In 0.1 a backend subclassed :class:`~sc_core.WorkerGroup` and overrode
``_execute_rank_async(rank, method_name, args, kwargs) -> handle``,
``_wait(handles, call) -> list`` and ``_is_worker_alive(worker) -> bool`` (optionally
``_pending_outputs``, ``_handle_done`` and ``_cancel_handle``). Such a subclass keeps
working: when it attaches no backend, its group runs through :class:`HookBackend`, which
calls those methods. New backends implement :class:`~sc_core.Backend` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._backend import CallHandle, RankArgs
from ._call import Call, active_call
from ._future import LazyFuture

if TYPE_CHECKING:
    from ._worker_group import WorkerGroup

__all__ = ["HOOKS", "HookBackend", "has_hooks"]

#: The methods a 0.1 backend had to implement.
HOOKS = ("_execute_rank_async", "_wait", "_is_worker_alive")


def has_hooks(group: WorkerGroup) -> bool:
    """Whether ``group``'s class implements every 0.1 backend hook."""
    return all(callable(getattr(type(group), hook, None)) for hook in HOOKS)


class HookBackend:
    """Runs a 0.1-style group's calls through its own hook methods."""

    def __init__(self, group: WorkerGroup) -> None:
        self._group: Any = group

    def start(self, call: Call, method_name: str, rank_args: Sequence[RankArgs]) -> CallHandle:
        # 0.1 hooks read the call through sc_core.current_call(): keep it set for them.
        with active_call(call):
            handles = [
                self._group._execute_rank_async(rank, method_name, args, kwargs)
                for rank, (args, kwargs) in zip(call.ranks, rank_args, strict=True)
            ]
        return CallHandle(call, handles)

    def wait(self, handle: CallHandle) -> list[Any]:
        with active_call(handle.call):
            return list(self._group._wait(handle.rank_handles, handle.call))

    def pending(self, handle: CallHandle) -> list[Any]:
        call = handle.call
        custom = getattr(self._group, "_pending_outputs", None)
        if custom is not None:
            return list(custom(handle.rank_handles, call))
        return [
            LazyFuture.completed(value, f"{call.method_name} rank {rank}")
            for rank, value in zip(call.ranks, self.wait(handle), strict=True)
        ]

    def is_done(self, rank_handle: Any) -> bool:
        done = getattr(self._group, "_handle_done", None)
        return True if done is None else bool(done(rank_handle))

    def cancel(self, rank_handle: Any) -> bool:
        cancel = getattr(self._group, "_cancel_handle", None)
        return False if cancel is None else bool(cancel(rank_handle))

    def is_alive(self, rank: int) -> bool:
        return bool(self._group._is_worker_alive(self._group._workers[rank]))

    def close(self) -> None:
        """A 0.1 backend had no close hook: its workers are its own to stop."""
