"""Weight sync, in one process: regions, layouts, the transfer plan's invariants (hypothesis),
and whole syncs over the in-memory channel with hand-made shards."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from _workers_sync_memory import run_in_memory
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_workers import ConfigError, SyncLayoutError, WeightSyncError
from sc_workers.sync import (
    ChannelSpec,
    ModelLayout,
    Region,
    StagedWeights,
    build_plan,
    open_channel,
    pack_pieces,
    plan_for,
)


def chunks(n: int, parts: int) -> list[tuple[int, int]]:
    """torch.chunk's split of ``n`` rows into ``parts`` (ceil-sized; trailing ones may be empty)."""
    size = -(-n // parts)
    return [(min(i * size, n), min((i + 1) * size, n)) for i in range(parts)]


def sharded_layout(
    shapes: dict[str, tuple[int, ...]], shards: int, replicas: int, dim: int = 0
) -> ModelLayout:
    """``replicas`` copies of ``shards`` ranks splitting dim ``dim`` (rank = rep * shards + s)."""
    ranks: list[dict[str, Region]] = []
    for _rep in range(replicas):
        for s in range(shards):
            held = {}
            for name, shape in shapes.items():
                d = min(dim, len(shape) - 1)
                lo, hi = chunks(shape[d], shards)[s]
                if hi > lo:
                    offset = tuple(lo if i == d else 0 for i in range(len(shape)))
                    local = tuple(hi - lo if i == d else n for i, n in enumerate(shape))
                    held[name] = Region(offset, local)
            ranks.append(held)
    return ModelLayout(shapes, dict.fromkeys(shapes, "float32"), tuple(ranks))


def test_region_operations() -> None:
    a = Region((2, 0), (4, 6))
    b = Region((4, 3), (5, 5))
    assert a.intersect(b) == Region((4, 3), (2, 3))
    assert a.intersect(Region((6, 0), (1, 6))) is None
    assert Region((4, 3), (2, 3)).within(a) == (slice(2, 4), slice(3, 6))
    assert a.numel == 24
    with pytest.raises(SyncLayoutError, match=r"offset \(1,\) and shape \(2, 2\) differ in rank"):
        Region((1,), (2, 2))
    with pytest.raises(SyncLayoutError, match="must be >= 0"):
        Region((-1,), (2,))


def test_layout_errors() -> None:
    shapes = {"w": (4, 2)}
    with pytest.raises(SyncLayoutError, match=r"rank 0's region .* of 'w' lies outside"):
        ModelLayout(shapes, {"w": "float32"}, ({"w": Region((3, 0), (2, 2))},))
    with pytest.raises(SyncLayoutError, match="rank 0 holds unknown tensor 'v'"):
        ModelLayout(shapes, {"w": "float32"}, ({"v": Region((0, 0), (1, 1))},))
    half = ModelLayout(shapes, {"w": "float32"}, ({"w": Region((0, 0), (2, 2))},))
    with pytest.raises(SyncLayoutError, match="hold 4 distinct elements of 'w', which has 8"):
        half.check_covers("trainer")
    overlap = ModelLayout(
        shapes,
        {"w": "float32"},
        ({"w": Region((0, 0), (3, 2))}, {"w": Region((2, 0), (2, 2))}),
    )
    with pytest.raises(SyncLayoutError, match="hold 10 distinct elements"):
        overlap.check_covers("trainer")
    sneaky = ModelLayout(
        shapes,
        {"w": "float32"},
        ({"w": Region((0, 0), (3, 2))}, {"w": Region((1, 0), (1, 2))}),
    )
    with pytest.raises(SyncLayoutError, match="overlap without being replicas"):
        sneaky.check_covers("trainer")
    with pytest.raises(
        SyncLayoutError, match=r"rank 1 reports 'w' as \(4, 3\) float32, another rank as \(4, 2\)"
    ):
        ModelLayout.from_ranks(
            [
                {"w": ((4, 2), "float32", (0, 0), (2, 2))},
                {"w": ((4, 3), "float32", (2, 0), (2, 3))},
            ]
        )


def test_plan_errors() -> None:
    src = sharded_layout({"w": (4, 2)}, 2, 1)
    with pytest.raises(SyncLayoutError, match=r"needs 1 tensors the trainer does not have"):
        build_plan(src, sharded_layout({"w": (4, 2), "b": (3,)}, 1, 1))
    with pytest.raises(
        SyncLayoutError, match=r"'w' has shape \(4, 2\) in the trainer and \(4, 3\)"
    ):
        build_plan(src, sharded_layout({"w": (4, 3)}, 1, 1))


SHAPES = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(
    shapes=SHAPES,
    src=st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(0, 2)),
    dst=st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(0, 2)),
)
def test_plan_sends_every_needed_element_once(
    shapes: dict[str, tuple[int, ...]],
    src: tuple[int, int, int],
    dst: tuple[int, int, int],
) -> None:
    source = sharded_layout(shapes, *src)
    destination = sharded_layout(shapes, *dst)
    plan = build_plan(source, destination)
    for d, held in enumerate(destination.ranks):
        # the pieces a destination rank receives tile its regions exactly, once each
        for name, region in held.items():
            mine = [p for p in plan.pieces if p.dst == d and p.name == name]
            assert sum(p.region.numel for p in mine) == region.numel
            for i, a in enumerate(mine):
                assert a.region.intersect(region) == a.region
                assert all(a.region.intersect(b.region) is None for b in mine[i + 1 :])
        assert plan.received_by(d) == 4 * sum(r.numel for r in held.values())
    for piece in plan.pieces:  # a sender only sends what it holds
        held_region = source.ranks[piece.src][piece.name]
        assert piece.region.intersect(held_region) == piece.region
    assert plan.total_bytes == sum(plan.sent_by(s) for s in range(source.world_size))


@settings(max_examples=40, deadline=None)
@given(shapes=SHAPES, replicas=st.integers(2, 4), dst_ranks=st.integers(1, 4))
def test_replicated_senders_share_the_work(
    shapes: dict[str, tuple[int, ...]], replicas: int, dst_ranks: int
) -> None:
    """Every source rank holds everything: the greedy choice keeps the senders within one
    piece of each other."""
    plan = build_plan(sharded_layout(shapes, 1, replicas), sharded_layout(shapes, dst_ranks, 1))
    loads = [plan.sent_by(s) for s in range(replicas)]
    biggest = max(p.nbytes for p in plan.pieces)
    assert max(loads) - min(loads) <= biggest


def test_plan_is_cached_per_pair_of_layouts() -> None:
    shapes = {"w": (8, 4), "b": (8,)}
    a = plan_for(sharded_layout(shapes, 2, 1), sharded_layout(shapes, 2, 2, dim=1))
    b = plan_for(sharded_layout(shapes, 2, 1), sharded_layout(shapes, 2, 2, dim=1))
    assert a is b
    c = plan_for(sharded_layout(shapes, 1, 2), sharded_layout(shapes, 2, 2, dim=1))
    assert c is not a


def _full(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) for n, s in shapes.items()}


def _run_sync(
    source: ModelLayout, destination: ModelLayout, full: dict[str, torch.Tensor], version: int
) -> list[tuple[StagedWeights, dict[str, torch.Tensor]]]:
    """A whole sync over the in-memory channel; returns each receiver's staged weights and
    its tensors after the commit (they start as zeros)."""
    plan = build_plan(source, destination)
    targets: list[dict[str, Any]] = [
        {name: (torch.zeros(region.shape), region) for name, region in held.items()}
        for held in destination.ranks
    ]
    _, received = run_in_memory(plan, full, targets, version)
    out = []
    for got, held in zip(received, targets, strict=True):
        # nothing written before the commit, everything after it
        assert all(not t.any() for t, _ in held.values())
        got.staged.commit()
        out.append((got.staged, {n: t for n, (t, _) in held.items()}))
    return out


def test_in_memory_sync_fsdp_to_tp_replicas() -> None:
    """dp=2 shards of dim 0 -> tp=2 along dim 1 (row-parallel) x 2 replicas."""
    shapes = {"w": (6, 4), "b": (5,), "m": (3, 3, 2)}
    full = _full(shapes, 0)
    source = sharded_layout(shapes, 2, 1)
    destination = sharded_layout(shapes, 2, 2, dim=1)
    staged = _run_sync(source, destination, full, version=1)
    for rank, (weights, tensors) in enumerate(staged):
        assert weights.version == 1
        for name, region in destination.ranks[rank].items():
            expected = full[name][region.within(Region.full(shapes[name]))]
            assert torch.equal(tensors[name], expected), (rank, name)
        assert weights.bytes_received == 4 * sum(r.numel for r in destination.ranks[rank].values())


def test_commit_applies_only_a_complete_version() -> None:
    region = Region((0,), (4,))
    live = torch.zeros(4)
    staged = StagedWeights(3, 0, {"w": (live, region)})
    with pytest.raises(WeightSyncError, match=r"v3: rank 0 received 0 of the 4 elements of 'w'"):
        staged.commit()
    plan = build_plan(sharded_layout({"w": (4,)}, 2, 1), sharded_layout({"w": (4,)}, 1, 1))
    first = plan.pieces_for(0)[0]
    dtypes = {"w": torch.float32}
    staged.add([first], torch.ones(2).view(torch.uint8), dtypes)
    with pytest.raises(WeightSyncError, match="received 2 of the 4"):
        staged.commit()
    with pytest.raises(WeightSyncError, match=r"got a piece of 'v', which it does not hold"):
        staged.add([first._replace(name="v")], torch.ones(2).view(torch.uint8), dtypes)
    with pytest.raises(WeightSyncError, match="got a message of 4 bytes for pieces of 8"):
        staged.add([first], torch.ones(1).view(torch.uint8), dtypes)
    outside = first._replace(region=Region((3,), (2,)))
    with pytest.raises(WeightSyncError, match=r"got region .* outside the"):
        staged.add([outside], torch.ones(2).view(torch.uint8), dtypes)
    assert math.isclose(float(live.sum()), 0.0)


def test_pack_handles_mixed_dtypes() -> None:
    """A float32 piece after a bfloat16 one starts off its alignment; the bytes still match."""
    shapes = {"a": (3,), "b": (4,)}
    layout = ModelLayout(
        shapes,
        {"a": "bfloat16", "b": "float32"},
        ({"a": Region.full((3,)), "b": Region.full((4,))},),
    )
    dst = ModelLayout(shapes, layout.dtypes, ({"a": Region.full((3,)), "b": Region.full((4,))},))
    plan = build_plan(layout, dst)
    held = {
        "a": (torch.arange(3, dtype=torch.bfloat16), Region.full((3,))),
        "b": (torch.arange(4, dtype=torch.float32) + 0.5, Region.full((4,))),
    }
    message = pack_pieces(plan.pair(0, 0), held)
    assert message.numel() == 3 * 2 + 4 * 4
    live = {"a": torch.zeros(3, dtype=torch.bfloat16), "b": torch.zeros(4)}
    staged = StagedWeights(1, 0, {n: (t, Region.full(t.shape)) for n, t in live.items()})
    staged.add(plan.pair(0, 0), message, {"a": torch.bfloat16, "b": torch.float32})
    staged.commit()
    assert torch.equal(live["a"], held["a"][0])
    assert torch.equal(live["b"], held["b"][0])


def test_in_memory_channel_times_out_naming_the_silent_peer() -> None:
    spec = ChannelSpec("memory", "silent-peer", 2, timeout_s=0.2)
    channel = open_channel(spec, 1)
    with pytest.raises(
        WeightSyncError, match=r"waited 0\.2 s for channel rank 0, which sent nothing"
    ):
        channel.exchange({}, {0: torch.empty(4, dtype=torch.uint8)})
    channel.close()


def test_channel_spec_errors() -> None:
    with pytest.raises(ConfigError, match="kind must be gloo, nccl or memory"):
        ChannelSpec("mpi", "x", 2)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="world_size must be >= 2"):
        ChannelSpec("memory", "x", 1)
    with pytest.raises(ConfigError, match="port must be a TCP port"):
        ChannelSpec("gloo", "x", 2)
    with pytest.raises(ConfigError, match="rank 5 is outside the channel's 2 participants"):
        open_channel(ChannelSpec("memory", "x", 2), 5)
