"""Replacing ranks of a worker group in place: :meth:`WorkerGroup.replace_ranks`.

A torch.distributed group cannot outlive one of its members, so replacing any rank re-forms
the collective state of the whole group, in three steps:

1. the backend (a :class:`~sc_core.backend.ReplacingBackend`) stops what is left of each replaced
   rank's worker and starts a new one with the same rank, world size, placement and
   environment, except a new rendezvous address (MASTER_ADDR / MASTER_PORT), and waits for
   its constructor;
2. the group forgets that those ranks died (and the calls it abandoned on them) and drops the
   mesh tables it cached, in every group sharing the workers (spawned and fused views too);
3. every rank, old and new, stores the new address in its environment and runs the worker
   hook :meth:`~sc_core.Worker.on_group_reformed`: a worker that uses torch.distributed tears
   down its process groups and what it built on them there. The driver then calls the
   group's set-up method again (``init_model``), which rendezvous at the new address. The
   group reads every rank's dispatch meshes again at its next mesh-dispatched call (the new
   workers registered theirs in their constructors).

The group object, its bound methods and its spawned views stay the same objects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import cast

from ._backend import ReplacingBackend
from ._call import check_timeout
from ._errors import BackendNotImplementedError, ConfigTypeError, InvalidConfigError
from ._runtime import GroupLike
from ._settings import WORKER_START_TIMEOUT

__all__ = ["REFORM_METHOD", "replace_ranks"]

logger = logging.getLogger("sc_core.worker_group")

#: The worker method every rank runs after a replacement (``Worker._sc_reform``).
REFORM_METHOD = "_sc_reform"


def _root(group: GroupLike) -> GroupLike:
    """The group the views were spawned from (its calls run the workers' own methods, not
    a fused role's)."""
    while group._spawned_from is not None:
        group = group._spawned_from
    return group


def _check_ranks(where: str, ranks: Iterable[int], world_size: int) -> list[int]:
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
        raise ConfigTypeError(f"{where}: ranks must be an iterable of ints, got {ranks!r}")
    chosen = list(ranks)
    bad = [r for r in chosen if isinstance(r, bool) or not isinstance(r, int)]
    if bad:
        raise ConfigTypeError(f"{where}: ranks must be ints, got {bad!r}")
    outside = [r for r in chosen if not 0 <= r < world_size]
    if outside:
        raise InvalidConfigError(
            f"{where}: ranks {outside} are outside the group's world size {world_size}"
        )
    return sorted(set(chosen))


def replace_ranks(
    group: GroupLike, ranks: Iterable[int] | None, timeout: float | None
) -> list[int]:
    """See :meth:`WorkerGroup.replace_ranks`."""
    root = _root(group)
    where = f"{type(group).__name__} {group.name_prefix!r}.replace_ranks"
    backend = root._sc_backend("replace_ranks")
    if not isinstance(backend, ReplacingBackend):
        raise BackendNotImplementedError(
            f"{where}: its backend {type(backend).__qualname__} cannot replace workers "
            "(it implements no sc_core.backend.ReplacingBackend.replace)"
        )
    if ranks is None:
        root.check_worker_aliveness()
        chosen = root.dead_ranks
    else:
        chosen = _check_ranks(where, ranks, root.world_size)
    if not chosen:
        return []
    limit = cast(
        float,
        WORKER_START_TIMEOUT.get()
        if timeout is None
        else check_timeout(f"{where}: timeout", timeout),
    )
    started = time.monotonic()
    result = backend.replace(chosen, limit)
    if sorted(result.workers) != chosen:
        raise BackendNotImplementedError(
            f"{where}: {type(backend).__qualname__}.replace returned workers for ranks "
            f"{sorted(result.workers)}, asked for {chosen}"
        )
    runtime = root._sc_runtime  # the views share it
    for rank, handle in result.workers.items():
        runtime.workers[rank] = handle
    runtime.liveness.revive(chosen)
    if runtime.journals is not None:  # a new worker's journal holds nothing
        runtime.journals.drop_ranks(chosen)
    runtime.master_addr, runtime.master_port = result.master_addr, result.master_port
    for view in list(runtime.views):
        view._mesh_cache.clear()
    root.execute_all_sync(REFORM_METHOD, result.master_addr, result.master_port, tuple(chosen))
    logger.warning(
        "worker group %s: replaced ranks %s in %.2f s; the group re-forms at %s:%s",
        root.name_prefix,
        chosen,
        time.monotonic() - started,
        result.master_addr,
        result.master_port,
    )
    return chosen
