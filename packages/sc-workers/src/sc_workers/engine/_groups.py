"""The process group of a multi-rank worker group: its generations, and its end when a rank fails.

A rank whose worker method raises while its peers may be in a collective with it (an FSDP
all-gather or reduce-scatter, a tensor-parallel all-reduce, a Ulysses all-to-all, a pipeline
send) would leave them blocked until ``SC_WORKERS_PG_TIMEOUT_S``. Instead it

1. publishes its rank and error in the c10d store the group rendezvoused at (a TCPStore that
   outlives the groups: this module keeps it), under the group's *generation*;
2. tears down every process group of this process (the default group and every group made
   from it: the engines' FSDP, tensor-parallel, Ulysses and pipeline groups), after the
   holders (the workers, :class:`GroupHolder`) have kept their state and dropped every
   object that references a group. gloo closes a group's connections only once its last
   reference is gone; then the peers' pending operations fail at once ("connection closed by
   peer"), they read the published failure (:meth:`ProcessGroups.failure`) and tear their
   groups down in turn;
3. writes an *acknowledgement* with the number of the last call that ran on the old
   generation.

The next call on each rank (``WorkerBase._catch_up``, :mod:`sc_workers.workers._common`)
waits for every rank's acknowledgement and joins generation ``g + 1``: a new default group
on the same store, under a new prefix. A rank that started a later call on the old groups
before it learnt of the failure (non-blocking calls) has that call aborted too; every rank's
acknowledgement says how far it got, so every rank aborts the same calls and rebuilds at the
same one.

A rank that finished its call before its peer failed learns of the failure at the start of
its next call (:meth:`ProcessGroups.failure`, one store look-up per call).

DTensor caches sharding decisions keyed by device meshes (which hold their groups); the
teardown clears those caches (:func:`_clear_dtensor_caches`) so that the groups can go.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d
from torch.distributed.tensor import DTensor

__all__ = [
    "FailureRecord",
    "GroupHolder",
    "ProcessGroups",
    "groups",
]

logger = logging.getLogger(__name__)

#: how long a rank whose collective failed waits for the failed rank's record (it is written
#: before the failed rank's groups close, so it is normally there at once)
RECORD_WAIT_S = 3.0
_PREFIX = "sc_workers"


class GroupHolder(Protocol):
    """An object that holds what was built on the process groups (a worker's engines)."""

    def release_groups(self) -> None:
        """Keep what the next call needs to rebuild what was built on the process groups
        (no collective), and drop every reference to the groups and to what was built on
        them."""
        ...


@dataclass(frozen=True)
class FailureRecord:
    """What the rank that failed published: its rank (``None``: no rank said, a rank that
    lost a peer published on its behalf), where, and its error as ``Type: message``."""

    rank: int | None
    where: str
    error: str

    def describe(self) -> str:
        who = "a peer rank" if self.rank is None else f"rank {self.rank}"
        where = f" in {self.where}" if self.where else ""
        return f"{who} failed{where}: {self.error}"


@dataclass
class ProcessGroups:
    """This process's view of its multi-rank group (one per process: a process has one
    default group, shared by every worker in it)."""

    store: Any = None  # a c10d TCPStore (torch's stubs do not export the store classes)
    address: tuple[str, str] | None = None
    world_size: int = 0
    rank: int = -1
    generation: int = 0
    torn_down: bool = False
    #: guarded calls started in this process since the group was formed (every rank makes the
    #: same calls, so the numbers agree across ranks)
    calls: int = 0
    holders: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)

    # ------------------------------------------------------------------ keys
    def _key(self, generation: int, name: str) -> str:
        return f"{_PREFIX}/g{generation}/{name}"

    @property
    def active(self) -> bool:
        """Whether this module formed the default group and it is up (world size > 1)."""
        return self.store is not None and not self.torn_down and dist.is_initialized()

    # ------------------------------------------------------------------ join
    def join(
        self,
        world_size: int,
        rank: int,
        backend: str,
        addr: str,
        port: str,
        timeout: timedelta,
    ) -> None:
        """Create the default group: at generation 0 on a new store, or, after a teardown
        (:meth:`tear_down`) at the same address, at the next generation on the kept store."""
        address = (str(addr), str(port))
        rebuild = self.torn_down and self.store is not None and self.address == address
        if rebuild:
            generation = self.generation + 1
        else:
            self.forget()
            generation = 0
            c10d: Any = dist
            self.store = c10d.TCPStore(
                host_name=address[0],
                port=int(address[1]),
                world_size=world_size,
                is_master=rank == 0,
                timeout=timeout,
                multi_tenant=True,
            )
            self.address = address
        c10d_: Any = dist
        dist.init_process_group(
            backend,
            store=c10d_.PrefixStore(self._key(generation, "pg"), self.store),
            rank=rank,
            world_size=world_size,
            timeout=timeout,
        )
        self.generation, self.torn_down = generation, False
        self.world_size, self.rank = world_size, rank
        if rebuild:
            logger.warning(
                "rank %d: rebuilt the process group (generation %d) after a rank failed",
                rank,
                generation,
            )

    def forget(self) -> None:
        """Drop the store and start over (the group was destroyed elsewhere or re-formed at
        a new address: ``replace_ranks``)."""
        self.store = None
        self.address = None
        self.generation = 0
        self.torn_down = False
        self.calls = 0

    def add_holder(self, holder: GroupHolder) -> None:
        self.holders.add(holder)

    def next_call(self) -> int:
        self.calls += 1
        return self.calls

    # ---------------------------------------------------------------- records
    def _read(self, generation: int, wait_s: float) -> FailureRecord | None:
        store = self.store
        if store is None:
            return None
        key = self._key(generation, "failed")
        try:
            if not store.check([key]):
                if wait_s <= 0:
                    return None
                store.wait([key], timedelta(seconds=wait_s))
            raw = store.get(key)
        except Exception as exc:  # the store is gone (its host died) or the wait timed out
            logger.debug(
                "rank %d: no failure record of generation %d: %s", self.rank, generation, exc
            )
            return None
        try:
            data = json.loads(raw.decode("utf-8"))
            rank = data.get("rank")
            return FailureRecord(
                rank if isinstance(rank, int) else None,
                str(data.get("where", "")),
                str(data.get("error", "")),
            )
        except (ValueError, AttributeError):
            return FailureRecord(None, "", raw.decode("utf-8", "replace"))

    def failure(self, wait_s: float = 0.0) -> FailureRecord | None:
        """The failure published for the current generation, waiting up to ``wait_s``."""
        return self._read(self.generation, wait_s)

    def publish(self, record: FailureRecord) -> FailureRecord | None:
        """Publish ``record`` for the current generation unless a rank already did; return
        the record that is there (``record`` itself, or the earlier one), ``None`` when the
        store cannot be reached."""
        store = self.store
        if store is None:
            return None
        payload = json.dumps({"rank": record.rank, "where": record.where, "error": record.error})
        try:
            stored = store.compare_set(self._key(self.generation, "failed"), "", payload)
        except Exception as exc:
            logger.warning("rank %d: could not publish its failure: %s", self.rank, exc)
            return None
        if stored.decode("utf-8", "replace") == payload:
            return record
        return self._read(self.generation, 0.0)

    # --------------------------------------------------------------- teardown
    def tear_down(self, last_call: int) -> None:
        """Release every holder, destroy every process group of this process, and
        acknowledge (``last_call``: the last call that ran on these groups)."""
        for holder in list(self.holders):
            try:
                holder.release_groups()
            except Exception:  # one holder must not keep the groups open for the others
                logger.exception("rank %d: releasing %r failed", self.rank, holder)
        alive = _destroy_all()
        self.torn_down = True
        if alive:
            logger.warning(
                "rank %d: %d process group(s) are still referenced after the teardown; their "
                "connections stay open, and peers blocked on them wait for their timeout",
                self.rank,
                alive,
            )
        store = self.store
        if store is not None:
            try:
                store.set(self._key(self.generation, f"ack/{self.rank}"), str(last_call))
            except Exception as exc:
                logger.warning("rank %d: could not acknowledge the teardown: %s", self.rank, exc)
        logger.warning(
            "rank %d: tore down the process groups of generation %d", self.rank, self.generation
        )

    def acknowledged_calls(self, timeout_s: float) -> dict[int, int]:
        """Every rank's last call on the torn-down generation, waiting up to ``timeout_s``
        for them; the ranks that did not acknowledge are missing."""
        store = self.store
        if store is None:
            return {}
        keys = {r: self._key(self.generation, f"ack/{r}") for r in range(self.world_size)}
        with contextlib.suppress(Exception):  # a timeout: report who is missing
            store.wait(list(keys.values()), timedelta(seconds=timeout_s))
        calls: dict[int, int] = {}
        for rank, key in keys.items():
            try:
                if store.check([key]):
                    calls[rank] = int(store.get(key).decode("utf-8"))
            except Exception as exc:
                logger.debug("rank %d: no acknowledgement of rank %d: %s", self.rank, rank, exc)
        return calls


def _process_groups() -> Iterator[dist.ProcessGroup]:
    yield from list(distributed_c10d._world.pg_map)


def _clear_caches(module: str, *names: str) -> None:
    """Clear the caches ``names`` (dotted paths: a function with ``cache_clear``, or a
    function that clears a cache) of ``module``, skipping what this torch does not have."""
    try:
        owner: Any = importlib.import_module(module)
    except ImportError:  # pragma: no cover - another torch layout
        return
    for name in names:
        target: Any = owner
        for part in name.split("."):
            target = getattr(target, part, None)
        clear = getattr(target, "cache_clear", target)
        if callable(clear):
            clear()


def _clear_dtensor_caches() -> None:
    """Drop DTensor's caches of sharding and redistribution decisions (in Python, and the
    dispatcher's native one): their keys or values hold device meshes, and a mesh holds its
    process groups."""
    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if callable(native):
        native()

    propagator: Any = DTensor._op_dispatcher.sharding_propagator
    for name in ("propagate_op_sharding", "_propagate_tensor_meta_cached"):
        clear = getattr(getattr(propagator, name, None), "cache_clear", None)
        if callable(clear):
            clear()
    _clear_caches(
        "torch.distributed.tensor._redistribute",
        "_gen_transform_infos",
        "clear_redistribute_planner_cache",
    )
    _clear_caches("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh")


def _destroy_all() -> int:
    """Destroy every process group of this process and collect the garbage that still
    references them; returns how many are still referenced (their connections stay open)."""
    if not dist.is_initialized():
        return 0
    refs = [weakref.ref(pg) for pg in _process_groups()]
    dist.destroy_process_group()
    _clear_dtensor_caches()
    gc.collect()
    return sum(ref() is not None for ref in refs)


_GROUPS = ProcessGroups()


def groups() -> ProcessGroups:
    """This process's :class:`ProcessGroups`."""
    return _GROUPS
