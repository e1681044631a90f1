"""Weight sync's wire format: frames (hypothesis), pieces that travel without a copy, the
receiver's staging space and the commit that switches storage instead of copying."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _workers_sync_memory import run_in_memory
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_workers import WeightSyncError
from sc_workers.sync import (
    ChannelSpec,
    ModelLayout,
    Piece,
    Region,
    StagedWeights,
    TransferPlan,
    build_plan,
    open_channel,
)
from sc_workers.sync._frames import FRAME_BYTES, frames_of

MIB = 1 << 20


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3 * MIB), max_size=40),
    frame_bytes=st.sampled_from([1, 1024, MIB]),
)
def test_frames_cover_every_piece_once_in_order(sizes: list[int], frame_bytes: int) -> None:
    pieces = [Piece(f"p{i}", 0, 0, Region((0,), (n,)), n) for i, n in enumerate(sizes)]
    frames = frames_of(pieces, frame_bytes)
    assert [p for f in frames for p in f.pieces] == pieces
    assert [f.tag for f in frames] == list(range(len(frames)))
    for frame in frames:
        assert frame.nbytes == sum(p.nbytes for p in frame.pieces)
        if len(frame.pieces) > 1:  # a batch of small pieces, closed once it is big enough
            assert all(p.nbytes < frame_bytes for p in frame.pieces)
            assert frame.nbytes - frame.pieces[-1].nbytes < frame_bytes


def _layout(shapes: dict[str, tuple[int, ...]], dims: dict[str, int | None], parts: int) -> Any:
    """``parts`` ranks splitting each tensor evenly along ``dims[name]`` (None: replicated)."""
    ranks = []
    for r in range(parts):
        held = {}
        for name, shape in shapes.items():
            dim = dims[name]
            if dim is None:
                held[name] = Region.full(shape)
                continue
            step = shape[dim] // parts
            offset = tuple(r * step if d == dim else 0 for d in range(len(shape)))
            held[name] = Region(offset, tuple(step if d == dim else n for d, n in enumerate(shape)))
        ranks.append(held)
    return ModelLayout(shapes, dict.fromkeys(shapes, "float32"), tuple(ranks))


def _full(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(shape, generator=g) for n, shape in shapes.items()}


def _targets(plan: TransferPlan, dtype: torch.dtype = torch.float32) -> list[Any]:
    return [
        {n: (torch.zeros(r.shape, dtype=dtype), r) for n, r in held.items()}
        for held in plan.destination.ranks
    ]


def _check(plan: TransferPlan, full: dict[str, torch.Tensor], targets: list[Any]) -> None:
    for held in targets:
        for name, (tensor, region) in held.items():
            expected = full[name][region.within(Region.full(full[name].shape))]
            assert torch.equal(tensor, expected.to(tensor.dtype)), name


SIDE = 1024
# pieces go in name order: col, norm, row, then the ten t* in a row (one batch per pair)
SHAPES = {"col": (SIDE, SIDE), "row": (SIDE, SIDE), "norm": (SIDE,)}
SHAPES |= {f"t{i}": (4, 5) for i in range(10)}


def test_contiguous_pieces_travel_without_a_copy_and_the_rest_is_packed() -> None:
    """FSDP dim-0 shards -> tensor parallel: dim-0 ("col") pieces are contiguous on both
    sides (no packed byte), dim-1 ("row") pieces only on the receiver (the sender packs them,
    the receiver takes them straight into its staging space), small ones are batched."""
    source = _layout(SHAPES, dict.fromkeys(SHAPES, 0), 2)
    destination = _layout(SHAPES, dict.fromkeys(SHAPES, None) | {"col": 0, "row": 1}, 2)
    plan = build_plan(source, destination)
    full = _full(SHAPES, 0)
    targets = _targets(plan)
    sent, received = run_in_memory(plan, full, targets, 1)
    for got in received:
        got.staged.commit()
    _check(plan, full, targets)
    row_piece = (SIDE // 2) ** 2 * 4  # a sender's rows of a receiver's columns: 1 MiB
    assert row_piece >= FRAME_BYTES  # a frame of its own
    batch = 10 * 2 * 5 * 4  # a sender's half of each t*, to each receiver
    for rank, out in enumerate(sent):
        packed = {d: int(m.numel()) for d, m in out.messages.items()}
        # per receiver: the row piece and the batch (norm's half is contiguous: sent as is)
        assert packed == {0: row_piece + batch, 1: row_piece + batch}, rank
    for got in received:  # only the batches were unpacked (each sender's, 16-byte aligned)
        assert {s: int(m.numel()) for s, m in got.messages.items()} == {0: 400, 1: 400}


def test_a_receiver_of_another_dtype_gets_cast_values() -> None:
    shapes: dict[str, tuple[int, ...]] = {"w": (SIDE, SIDE)}
    source = _layout(shapes, {"w": 0}, 2)
    destination = _layout(shapes, {"w": 0}, 2)
    plan = build_plan(source, destination)
    full = _full(shapes, 1)
    targets = _targets(plan, torch.bfloat16)
    _, received = run_in_memory(plan, full, targets, 1)
    for got in received:
        got.staged.commit()
    _check(plan, full, targets)


def test_commit_switches_storage_and_the_old_storage_stages_the_next_sync() -> None:
    shapes: dict[str, tuple[int, ...]] = {"w": (SIDE, SIDE), "b": (SIDE,)}
    source = _layout(shapes, {"w": 0, "b": None}, 2)
    destination = _layout(shapes, {"w": 1, "b": None}, 2)
    plan = build_plan(source, destination)
    targets = _targets(plan)
    live = {n: t for n, (t, _) in targets[0].items()}
    first = {n: t.data_ptr() for n, t in live.items()}
    _, received = run_in_memory(plan, _full(shapes, 2), targets, 1)
    staged_at = {n: received[0].staged.staging(n)[0].data_ptr() for n in live}
    assert all(t.abs().sum() == 0 for t in live.values())  # nothing applied before the commit
    spares = [got.staged.commit() for got in received]
    assert {n: t.data_ptr() for n, t in live.items()} == staged_at  # no copy: a switch
    assert {n: t.data_ptr() for n, t in spares[0].items()} == first
    full = _full(shapes, 3)
    _, received = run_in_memory(plan, full, targets, 2, spare=list(spares))
    assert {n: received[0].staged.staging(n)[0].data_ptr() for n in live} == first
    for got in received:
        got.staged.commit()
    assert {n: t.data_ptr() for n, t in live.items()} == first
    _check(plan, full, targets)


def test_a_target_that_is_a_view_gets_the_values_copied_in() -> None:
    """A live tensor inside a larger buffer keeps its place; its values are copied."""
    buffer = torch.zeros(2, 4)
    live = buffer[1]
    staged = StagedWeights(1, 0, {"w": (live, Region.full((4,)))})
    piece = Piece("w", 0, 0, Region.full((4,)), 16)
    staged.add([piece], torch.arange(4.0).view(torch.uint8), {"w": torch.float32})
    spare = staged.commit()
    assert torch.equal(buffer[1], torch.arange(4.0))
    assert live.data_ptr() == buffer[1].data_ptr()
    assert torch.equal(spare["w"], torch.arange(4.0))
    with pytest.raises(WeightSyncError, match="v1: rank 0 committed this version already"):
        staged.commit()


def test_spare_of_the_wrong_shape_is_not_reused() -> None:
    live = torch.zeros(4)
    wrong = {"w": torch.zeros(5)}
    staged = StagedWeights(1, 0, {"w": (live, Region.full((4,)))}, spare=wrong)
    assert staged.staging("w")[0].shape == (4,)
    assert staged.staging("w")[0].data_ptr() != wrong["w"].data_ptr()


def test_in_memory_messages_are_matched_by_tag() -> None:
    spec = ChannelSpec("memory", "tags", 2, timeout_s=5)
    a, b = open_channel(spec, 0), open_channel(spec, 1)
    a.isend(1, torch.tensor([1, 1], dtype=torch.uint8), tag=1)
    a.isend(1, torch.tensor([0, 0], dtype=torch.uint8), tag=0)
    first, second = torch.empty(2, dtype=torch.uint8), torch.empty(2, dtype=torch.uint8)
    pending = [b.irecv(0, first, tag=0), b.irecv(0, second, tag=1)]
    for p in pending:
        p.wait()
    assert first.tolist() == [0, 0]
    assert second.tolist() == [1, 1]
    a.close()
    b.close()
