"""The README's custom RPC layer, run for real: a thread-pool worker group on sc-dispatch alone.

Keep ``ThreadPoolWorkerGroup`` and ``Doubler`` in step with packages/sc-dispatch/README.md.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sc_dispatch as scd
from sc_dispatch import ext

# --- README example begins ------------------------------------------------------------------


class ThreadPoolWorkerGroup:
    """One worker object per rank; every registered method becomes a distributed call."""

    def __init__(self, worker_cls: type, world_size: int) -> None:
        self.workers = [worker_cls(rank) for rank in range(world_size)]
        self.pool = ThreadPoolExecutor(max_workers=world_size)
        self.meshes: dict[str, ext.MeshLayout] = {}  # N-d dispatch asks on every call
        for name in dir(worker_cls):
            attrs = ext.get_register_attrs(getattr(worker_cls, name))
            if attrs is not None:
                setattr(self, name, self._bind(name, attrs))

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def query_mesh(self, mesh: str) -> ext.MeshLayout:
        if mesh not in self.meshes:  # a KeyError (unregistered mesh) is a MeshLayoutError
            self.meshes[mesh] = ext.MeshLayout(
                tuple(w.dp_rank[mesh] for w in self.workers),
                tuple(w.is_collect[mesh] for w in self.workers),
                mesh_name=mesh,
            )
        return self.meshes[mesh]

    def _bind(self, name: str, attrs: ext.RegisterAttrs) -> Callable[..., Any]:
        spec = ext.resolve_dispatch_mode(attrs.dispatch_mode)

        def call(*call_args: Any, **call_kwargs: Any) -> Any:
            plan = spec.plan(self, attrs.execute_mode, call_args, call_kwargs)  # 1. plan
            kept: list[Future[Any]] = []
            for i, unit in enumerate(plan.units):  # 2. run each unit on its slot's ranks
                index = i % len(plan.slots) if unit.slot is None else unit.slot
                slot = plan.slots[index]
                # what each rank receives (a rank that does not read the batch: metadata only)
                rank_args = plan.rank_arguments(unit, index)
                for rank, (args, kwargs) in zip(slot.ranks, rank_args, strict=True):
                    method = getattr(self.workers[rank], name)
                    future = self.pool.submit(method, *args, **kwargs)
                    if rank == slot.collect_rank:  # the output the join keeps
                        kept.append(future)
            if not attrs.blocking:
                return kept
            return plan.join([f.result() for f in kept])  # 3. wait, then join

        return call


class Doubler:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.dp_rank = {"tp2": rank // 2}  # ranks (0, 1) and (2, 3) form dp groups
        self.is_collect = {"tp2": rank % 2 == 0}

    @scd.register(dispatch_mode=scd.Dispatch.DP_COMPUTE_PROTO)
    def double(self, rows: scd.Rows) -> scd.Rows:
        return scd.Rows(2 * x for x in rows)

    @scd.register(dispatch_mode=scd.Dispatch.ONE_TO_ALL)
    def whoami(self, prefix: str) -> str:
        return f"{prefix}{self.rank}"

    @scd.register(dispatch_mode=scd.Dispatch.RANK_ZERO)
    def leader(self) -> int:
        return self.rank

    @scd.register(dispatch_mode=scd.make_nd_compute_dataproto_dispatch_fn("tp2"))
    def tp_double(self, rows: scd.Rows) -> scd.Rows:
        return scd.Rows(2 * x for x in rows)

    @scd.register()  # ALL_TO_ALL: lists of world-size entries go one per rank
    def add(self, x: int, y: int) -> int:
        return x + y


# --- README example ends --------------------------------------------------------------------


@pytest.fixture
def group() -> Any:
    wg = ThreadPoolWorkerGroup(Doubler, 4)
    yield wg
    wg.pool.shutdown(wait=True)


def test_binds_every_registered_method(group: Any) -> None:
    assert {"double", "whoami", "leader", "tp_double", "add"} <= set(vars(group))
    assert isinstance(group, ext.DispatchWorkerGroup)


def test_dp_compute_proto_call(group: Any) -> None:
    assert group.double(scd.Rows(range(12))) == [2 * x for x in range(12)]


def test_one_to_all_and_rank_zero_calls(group: Any) -> None:
    assert group.whoami("w") == ["w0", "w1", "w2", "w3"]
    assert group.leader() == 0


def test_all_to_all_call(group: Any) -> None:
    assert group.add([1, 2, 3, 4], [10, 10, 10, 10]) == [11, 12, 13, 14]


def test_nd_call(group: Any) -> None:
    assert group.tp_double(scd.Rows([1, 2, 3, 4])) == [2, 4, 6, 8]
    assert group.meshes == {"tp2": ext.MeshLayout.from_sizes(2, 2)}


def test_runs_on_pool_threads() -> None:
    seen: set[str] = set()

    class Recorder:
        def __init__(self, rank: int) -> None:
            self.rank = rank

        @scd.register(dispatch_mode=scd.Dispatch.ONE_TO_ALL)
        def where(self) -> None:
            seen.add(threading.current_thread().name)

    wg: Any = ThreadPoolWorkerGroup(Recorder, 2)
    try:
        wg.where()
    finally:
        wg.pool.shutdown(wait=True)
    assert seen
    assert threading.current_thread().name not in seen


def test_non_blocking_returns_futures() -> None:
    class Lazy:
        def __init__(self, rank: int) -> None:
            self.rank = rank

        @scd.register(dispatch_mode=scd.Dispatch.ONE_TO_ALL, blocking=False)
        def value(self) -> int:
            return self.rank * 10

    wg: Any = ThreadPoolWorkerGroup(Lazy, 3)
    try:
        futures = wg.value()
        assert all(isinstance(f, Future) for f in futures)
        assert [f.result() for f in futures] == [0, 10, 20]
    finally:
        wg.pool.shutdown(wait=True)


README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_holds_this_files_example_verbatim() -> None:
    source = Path(__file__).read_text(encoding="utf-8")
    example = source.split("# --- README example begins")[1].split("# --- README example ends")[0]
    body = example.split("\n", 1)[1].strip()  # drop the rest of the marker line
    assert body.startswith("class ThreadPoolWorkerGroup")
    assert any(body in block for block in _readme_python_blocks())


@pytest.mark.parametrize("index", [0, 1])
def test_readme_examples_run(index: int) -> None:
    blocks = _readme_python_blocks()
    assert len(blocks) == 2
    namespace: dict[str, Any] = {"__name__": f"readme_example_{index}"}
    exec(compile(blocks[index], f"README.md block {index}", "exec"), namespace)
