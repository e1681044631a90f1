"""The README's custom RPC layer, run for real: a thread-pool worker group on sc-dispatch alone.

Keep ``ThreadPoolWorkerGroup`` and ``Doubler`` in step with packages/sc-dispatch/README.md.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
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
        self._dispatch_info: dict[str, list[int]] = {}  # N-d mesh caches
        self._collect_info: dict[str, list[bool]] = {}
        for name in dir(worker_cls):
            attrs = ext.get_register_attrs(getattr(worker_cls, name))
            if attrs is not None:
                setattr(self, name, self._bind(name, attrs))

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def _query_dispatch_info(self, mesh: str) -> list[int]:
        return [w.dp_rank[mesh] for w in self.workers]

    def _query_collect_info(self, mesh: str) -> list[bool]:
        return [w.is_collect[mesh] for w in self.workers]

    def _bind(self, name: str, attrs: ext.RegisterAttrs) -> Callable[..., Any]:
        spec = ext.resolve_dispatch_mode(attrs.dispatch_mode)
        rank_zero = attrs.execute_mode is scd.Execute.RANK_ZERO

        def call(*call_args: Any, **call_kwargs: Any) -> Any:
            args, kwargs = spec.dispatch_fn(self, *call_args, **call_kwargs)  # 1. dispatch
            pad = ext.pop_padding_size(kwargs)
            calls: list[tuple[Any, Sequence[Any], dict[str, Any]]]
            if rank_zero:  # 2. execute
                calls = [(self.workers[0], args, kwargs)]
            else:  # rank r gets entry r of every per-rank list (verl's execute_all rule)
                n = self.world_size

                def pick(v: Any, r: int) -> Any:
                    return v[r] if isinstance(v, list) and len(v) == n else v

                calls = [
                    (w, [pick(a, r) for a in args], {k: pick(v, r) for k, v in kwargs.items()})
                    for r, w in enumerate(self.workers)
                ]
            futures = [self.pool.submit(getattr(w, name), *a, **kw) for w, a, kw in calls]
            if not attrs.blocking:
                return futures
            outputs = [f.result() for f in futures]  # 3. wait, then collect and unpad
            out = spec.collect_fn(self, outputs[0] if rank_zero else outputs)
            return ext.unpad_output(out, pad) if spec.unpad_output else out

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

    @scd.register()  # ALL_TO_ALL: a list of world-size entries is split, the rest broadcast
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
    assert group.add([1, 2, 3, 4], 10) == [11, 12, 13, 14]


def test_nd_call(group: Any) -> None:
    assert group.tp_double(scd.Rows([1, 2, 3, 4])) == [2, 4, 6, 8]
    assert group._dispatch_info == {"tp2": [0, 0, 1, 1]}


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
