"""Pipeline stages on the in-process backend: 2 stages x 2 dp (pp slowest), the first and
last stage registered to receive the data, and a 3-stage group whose middle stage gets its
dp shard's metadata only; registration and layout errors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from _core_fakes import group
from sc_core import ConfigTypeError, LocalWorkerGroup, MeshRegistrationError, Worker, WorkerError
from sc_core.backend import worker_context
from sc_dispatch import (
    MeshLayoutError,
    Rows,
    make_balanced_dispatch_fn,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from sc_dispatch.ext import MeshLayout, chunk_sizes, register_shardable


class MetaBatch:
    """Rows plus batch-level ``meta``; the metadata-only form has ``rows=None`` and keeps
    the row count (what a DataProto with no columns is)."""

    def __init__(self, rows: Sequence[Any] | None, meta: dict[str, Any], n: int = 0) -> None:
        self.rows = None if rows is None else list(rows)
        self.meta = meta
        self.n = n if self.rows is None else len(self.rows)

    def __repr__(self) -> str:
        return f"MetaBatch({self.rows!r}, n={self.n}, meta={self.meta!r})"


class MetaBatchAdapter:
    def length(self, obj: MetaBatch) -> int:
        return obj.n

    def chunk(self, obj: MetaBatch, chunks: int) -> list[MetaBatch]:
        rows, parts, start = obj.rows or [], [], 0
        for size in chunk_sizes(len(rows), chunks):
            parts.append(MetaBatch(rows[start : start + size], dict(obj.meta)))
            start += size
        return parts

    def concat(self, parts: Sequence[MetaBatch]) -> MetaBatch:
        return MetaBatch([r for p in parts for r in (p.rows or [])], dict(parts[0].meta))

    def pad(self, obj: MetaBatch, pad_size: int) -> MetaBatch:
        rows = obj.rows or []
        return MetaBatch([*rows, *(rows[i % len(rows)] for i in range(pad_size))], obj.meta)

    def unpad(self, obj: MetaBatch, pad_size: int) -> MetaBatch:
        rows = obj.rows or []
        return MetaBatch(rows[: len(rows) - pad_size], obj.meta)

    def auto_padding(self, obj: MetaBatch) -> bool:
        return True

    def metadata_only(self, obj: MetaBatch) -> MetaBatch:
        return MetaBatch(None, dict(obj.meta), obj.n)


register_shardable(MetaBatch, MetaBatchAdapter())


class StageWorker(Worker):
    """``stages`` pipeline stages x dp (pp slowest, tp 1): the first and last stage read the
    batch, the last stage's output is collected."""

    stages = 2

    def __init__(self) -> None:
        super().__init__()
        dp_size = self.world_size // self.stages
        self.stage, self.dp = divmod(self.rank, dp_size)
        last = self.stage == self.stages - 1
        self._register_dispatch_collect_info(
            "actor", self.dp, is_collect=last, receives_data=self.stage in (0, self.stages - 1)
        )
        self.received: list[Any] = []

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def forward(self, batch: MetaBatch, ids: Rows | None = None) -> MetaBatch:
        self.received.append((batch, ids))
        rows = batch.rows if batch.rows is not None else ["meta"] * batch.n
        return MetaBatch([(self.rank, r) for r in rows], batch.meta)

    @register(dispatch_mode=make_balanced_dispatch_fn(1, mesh_name="actor"))
    def forward_balanced(self, batch: MetaBatch) -> MetaBatch:
        self.received.append((batch, None))
        return MetaBatch(batch.rows if batch.rows is not None else [None] * batch.n, batch.meta)


class ThreeStageWorker(StageWorker):
    stages = 3


@pytest.fixture
def wg() -> Iterator[LocalWorkerGroup]:
    with group((4,), StageWorker) as g:
        yield g


def test_first_and_last_stages_get_the_shard_and_outputs_collect_in_dp_order(
    wg: LocalWorkerGroup,
) -> None:
    layout = wg.query_mesh("actor")
    assert layout == MeshLayout(
        (0, 1, 0, 1), (False, False, True, True), receives_data=(True, True, True, True)
    )
    out = wg.forward(MetaBatch(range(4), {"step": 7}))
    assert out.rows == [(2, 0), (2, 1), (3, 2), (3, 3)]
    got = [w.received[-1][0] for w in wg.workers]
    assert [b.rows for b in got] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    assert got[0] is got[2]  # both stages of dp 0 read the same shard object


def test_a_middle_stage_gets_a_shared_metadata_only_shard() -> None:
    with group((6,), ThreeStageWorker) as g:
        assert g.query_mesh("actor").receives_data == (True, True, False, False, True, True)
        out = g.forward(MetaBatch(range(6), {"step": 7}), ids=Rows("abcdef"))
        assert out.rows == [(4, 0), (4, 1), (4, 2), (5, 3), (5, 4), (5, 5)]
        got = [w.received[-1] for w in g.workers]
        batches = [b for b, _ in got]
        assert [b.rows for b in batches] == [[0, 1, 2], [3, 4, 5], None, None, [0, 1, 2], [3, 4, 5]]
        for middle in batches[2:4]:
            assert middle.n == 3
            assert middle.meta == {"step": 7}
        assert batches[2] is batches[3]  # one object for the call
        # an argument without a metadata form reaches the middle stage unchanged
        assert [ids for _, ids in got] == [Rows("abc"), Rows("def")] * 3
        # padding: 5 rows over dp 2 pad to 6; the metadata form has the padded row count
        out = g.forward(MetaBatch(range(5), {}))
        assert [r for _, r in out.rows] == [0, 1, 2, 3, 4]
        assert g.workers[2].received[-1][0].n == 3


def test_a_balanced_mode_on_the_mesh_strips_each_micro_shard() -> None:
    with group((6,), ThreeStageWorker) as g:
        out = g.forward_balanced(MetaBatch(range(4), {"k": 1}))
        assert out.rows == [0, 1, 2, 3]
        middle = [b for w in g.workers[2:4] for b, _ in w.received]
        assert middle
        assert all(b.rows is None and b.n == 1 for b in middle)
        last = [r for w in g.workers[4:] for b, _ in w.received for r in (b.rows or [])]
        assert sorted(last) == [0, 1, 2, 3]


class StarvedWorker(Worker):
    """dp group 1 has no rank that receives the data."""

    def __init__(self) -> None:
        super().__init__()
        stage, dp = divmod(self.rank, 2)
        self._register_dispatch_collect_info(
            "actor", dp, is_collect=stage == 1, receives_data=dp == 0
        )

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def forward(self, batch: MetaBatch) -> MetaBatch:  # pragma: no cover - never runs
        return batch


def test_a_dp_group_without_a_receiving_rank_is_an_error_on_the_driver() -> None:
    with group((4,), StarvedWorker) as g:
        with pytest.raises(MeshLayoutError) as info:
            g.forward(MetaBatch(range(4), {}))
        text = str(info.value)
        assert "forward" in text
        assert "mesh 'actor': every dp group needs at least one rank that receives" in text
        assert "dp rank 1: ranks [1, 3]" in text
        assert not isinstance(info.value, WorkerError)
        assert "actor" not in g._mesh_cache.layouts()


def _bare_worker() -> Worker:
    with worker_context({"WORLD_SIZE": "2", "RANK": "1"}):
        return Worker()


@pytest.mark.parametrize("value", [1, "no", None])
def test_receives_data_must_be_a_bool(value: Any) -> None:
    w = _bare_worker()
    with pytest.raises(ConfigTypeError) as info:
        w._register_dispatch_collect_info("m", 0, True, receives_data=value)
    assert isinstance(info.value, TypeError)
    text = str(info.value)
    assert "Worker._register_dispatch_collect_info (rank 1)" in text
    assert f"receives_data for mesh 'm' must be a bool, got {type(value).__name__} {value!r}" in (
        text
    )
    assert w.get_dispatch_collect()["dispatch_dp_rank"] == {}  # nothing registered


def test_the_flag_is_positional_too_and_travels_with_get_and_set_dispatch_collect() -> None:
    source = _bare_worker()
    source._register_dispatch_collect_info("engine", 1, False, False)
    assert source._query_receives_data_info("engine") is False
    tables = source.get_dispatch_collect()
    assert tables["receives_data"] == {"engine": False}
    target = _bare_worker()
    target.set_dispatch_collect("ref", **tables)
    assert target._query_receives_data_info("ref") is False
    verl = _bare_worker()
    verl.set_dispatch_collect("ref", {"engine": 1}, {"engine": False})  # verl's two tables
    assert verl._query_receives_data_info("ref") is True
    with pytest.raises(MeshRegistrationError, match="already registered"):
        target._register_dispatch_collect_info("ref", 0, True, receives_data=True)
    with pytest.raises(KeyError, match=r"_query_receives_data_info \(rank 1\): mesh 'x'"):
        target._query_receives_data_info("x")
