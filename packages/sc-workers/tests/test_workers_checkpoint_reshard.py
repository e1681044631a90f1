"""Checkpoints load into another parallel layout: one block from any saved blocks
(hypothesis), a checkpoint split by hand into fake ranks (world size 1, exact), the error
paths, and real multi-rank saves (FSDP dp 2, megatron tp 2 x dp 2) loaded at other dp/tp
sizes and strategies, whose next update equals the run that never changed layout."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from _workers_helpers import critic_config, full_weights, launch, make_tensors, proto
from _workers_reshard_helpers import Step, load_and_update, pipeline_reshard_job, reshard_job
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_workers import CheckpointError, CriticWorker
from sc_workers.engine import ParallelLayout
from sc_workers.sync._layout import Region
from sc_workers.workers._reshard import blocks_differ, fill_block, plan_block, rng_source

PROPERTY = settings(deadline=None, max_examples=60)
#: the next update after a load equals the run that never changed layout (float32)
ATOL = 1e-5

# ------------------------------------------------------------ one block, pure


@st.composite
def partitions(draw: st.DrawFn, shape: tuple[int, ...]) -> list[Region]:
    """Blocks that tile ``shape``: cut along dim 0 or 1, then cut each part along dim 0 or 1
    again (FSDP over TP shards, TP rows or columns); parts may be empty (uneven shards)."""
    dims = [0] if len(shape) == 1 else [0, 1]

    def cuts(n: int) -> list[tuple[int, int]]:
        k = draw(st.integers(1, 4))
        points = sorted(draw(st.lists(st.integers(0, n), min_size=k - 1, max_size=k - 1)))
        bounds = [0, *points, n]
        return list(itertools.pairwise(bounds))

    first, second = draw(st.sampled_from(dims)), draw(st.sampled_from(dims))
    blocks = []
    for lo, hi in cuts(shape[first]):
        offset, size = [0] * len(shape), list(shape)
        offset[first], size[first] = lo, hi - lo
        for lo2, hi2 in cuts(size[second]):
            inner_offset, inner_size = list(offset), list(size)
            inner_offset[second], inner_size[second] = offset[second] + lo2, hi2 - lo2
            blocks.append(Region(tuple(inner_offset), tuple(inner_size)))
    return blocks


@st.composite
def saved_blocks(draw: st.DrawFn, shape: tuple[int, ...]) -> list[Region]:
    """A partition of ``shape`` with replicas (tp-replicated, HSDP), in any rank order."""
    blocks = draw(partitions(shape))
    copies = [b for b in blocks for _ in range(draw(st.integers(1, 3)))]
    return list(draw(st.permutations(copies)))


shapes = st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple)


def _full(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)


def _labelled(blocks: list[Region]) -> list[tuple[str, Region]]:
    return [(f"rank_{i:05d}", block) for i, block in enumerate(blocks)]


@PROPERTY
@given(st.data())
def test_a_block_built_from_saved_blocks_is_the_full_tensors_slice(data: st.DataObject) -> None:
    shape = data.draw(shapes)
    full = _full(shape)
    whole = Region.full(shape)
    sources = data.draw(saved_blocks(shape))
    tensors = [full[block.within(whole)] for block in sources]
    for target in data.draw(partitions(shape)):
        pieces = plan_block("test", "w", target, _labelled(sources))
        got = fill_block(target.shape, full.dtype, pieces, tensors)
        assert torch.equal(got, full[target.within(whole)])
        assert sum(p.region.numel for p in pieces) == target.numel  # each element read once


@PROPERTY
@given(st.data())
def test_a_missing_or_overlapping_saved_block_is_an_error(data: st.DataObject) -> None:
    shape = data.draw(shapes)
    blocks = data.draw(partitions(shape))
    present = [b for b in blocks if b.numel]
    lost = data.draw(st.sampled_from(present))
    rest = [b for b in blocks if b != lost]
    with pytest.raises(CheckpointError, match=r"test: the saved blocks of w cover \d+ of "):
        plan_block("test", "w", Region.full(shape), _labelled(rest))
    grown = Region(lost.offset, (lost.shape[0] + 1, *lost.shape[1:]))  # one row taller
    if grown.inside(shape):  # overlaps the block below it
        with pytest.raises(CheckpointError, match="overlap without being replicas"):
            plan_block("test", "w", Region.full(shape), _labelled([*rest, grown]))


def test_a_scalar_and_an_empty_block() -> None:
    scalar = Region((), ())
    pieces = plan_block("test", "s", scalar, [("a", scalar), ("b", scalar)])
    assert torch.equal(
        fill_block((), torch.float32, pieces, [torch.tensor(3.0)] * 2), torch.tensor(3.0)
    )
    empty = Region((4, 0), (0, 3))
    assert plan_block("test", "e", empty, []) == []
    with pytest.raises(CheckpointError, match=r"cover 0 of 6 elements of the block \[0:2, 0:3\]"):
        plan_block("test", "e", Region((0, 0), (2, 3)), [("rank_00001", empty)])


def test_the_rng_source_is_the_saved_rank_at_the_same_dp_rank() -> None:
    tp2_dp2 = {"world_size": 4, "dp_size": 2, "tp_size": 2}
    dp4 = [ParallelLayout.create(4, rank) for rank in range(4)]
    assert [rng_source(tp2_dp2, layout, "here") for layout in dp4] == [0, 2, None, None]
    tp2_dp1 = [ParallelLayout.create(2, rank, tp_size=2) for rank in range(2)]
    assert [rng_source(tp2_dp2, layout, "here") for layout in tp2_dp1] == [0, 1]
    tp4 = [ParallelLayout.create(4, rank, tp_size=4) for rank in range(4)]
    assert [rng_source(tp2_dp2, layout, "here") for layout in tp4] == [0, 1, 0, 0]
    with pytest.raises(CheckpointError, match=r"here: meta.json says world size 3 with sizes"):
        rng_source({**tp2_dp2, "world_size": 3}, dp4[0], "here")


def test_a_file_of_the_same_sizes_with_other_blocks_is_resharded() -> None:
    """Same world and parallel sizes but other blocks (HSDP vs FSDP): resharded; another
    model: left to the direct load, which names what differs."""
    module = torch.nn.Linear(4, 2, bias=False)
    same = {"model": {"weight": torch.zeros(2, 4)}, "model_chunks": {"weight": ([2, 4], [0, 0])}}
    half = {"model": {"weight": torch.zeros(1, 4)}, "model_chunks": {"weight": ([2, 4], [1, 0])}}
    other = {"model": {"weight": torch.zeros(3, 4)}, "model_chunks": {"weight": ([3, 4], [0, 0])}}
    assert [blocks_differ(s, module) for s in (same, half, other)] == [False, True, False]
    assert not blocks_differ({"model": {"bias": torch.zeros(2)}, "model_chunks": {}}, module)


# ------------------------------------- a checkpoint split into fake ranks, world size 1


@pytest.fixture
def single_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")


def _split(version: Path, dest: Path, parts: int) -> Path:
    """The world-size-1 checkpoint ``version`` as ``parts`` FSDP-like ranks (every tensor cut
    along dim 0, possibly unevenly; the rest copied), published in ``dest``."""
    state = torch.load(version / "rank_00000_of_00001.pt", weights_only=True)
    out = dest / "v000001"
    out.mkdir(parents=True)

    def piece(t: torch.Tensor, rank: int) -> torch.Tensor:
        return t if t.dim() == 0 else torch.tensor_split(t, parts)[rank].clone()

    def start(shape: list[int], rank: int) -> list[int]:
        if not shape:
            return []
        sizes = [len(c) for c in torch.tensor_split(torch.empty(shape[0]), parts)]
        return [sum(sizes[:rank])] + [0] * (len(shape) - 1)

    for rank in range(parts):
        part = dict(state)
        part["model"] = {n: piece(t, rank) for n, t in state["model"].items()}
        part["model_chunks"] = {
            n: (shape, start(shape, rank)) for n, (shape, _) in state["model_chunks"].items()
        }
        part["optim"] = {
            "param_groups": state["optim"]["param_groups"],
            "state": {
                idx: {k: v if k == "step" else piece(v, rank) for k, v in entry.items()}
                for idx, entry in state["optim"]["state"].items()
            },
        }
        torch.save(part, out / f"rank_{rank:05d}_of_{parts:05d}.pt")
    meta = json.loads((version / "meta.json").read_text())
    meta.update(world_size=parts, dp_size=parts)
    (out / "meta.json").write_text(json.dumps(meta))
    (dest / "CURRENT").write_text("v000001")
    return out


def _critic() -> CriticWorker:
    critic = CriticWorker(critic_config())
    critic.init_model()
    return critic


def _batch(seed: int) -> Any:
    return proto(make_tensors(8, seed=seed))


@pytest.fixture
def split_critic(single_rank: None, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A critic's checkpoint after one update, split into 3 fake ranks; and what the next
    update of the critic that saved it gives."""
    critic = _critic()
    critic.update_critic(_batch(1))
    critic.save_checkpoint(str(tmp_path / "one"))
    weights = full_weights(critic.critic_engine)
    metrics = critic.update_critic(_batch(2)).meta_info["metrics"]
    _split(tmp_path / "one" / "v000001", tmp_path / "three", 3)
    return tmp_path / "three", {"weights": weights, "metrics": metrics}


def test_a_checkpoint_of_three_ranks_loads_at_one_exactly(
    split_critic: tuple[Path, dict[str, Any]],
) -> None:
    path, expected = split_critic
    critic = _critic()
    critic.load_checkpoint(str(path))
    for name, tensor in full_weights(critic.critic_engine).items():
        assert torch.equal(tensor, expected["weights"][name]), name
    assert critic.update_critic(_batch(2)).meta_info["metrics"] == expected["metrics"]


def _rank_files(path: Path) -> list[Path]:
    return sorted((path / "v000001").glob("rank_*.pt"))


def _edit(file: Path, change: Any) -> None:
    state = torch.load(file, weights_only=True)
    change(state)
    torch.save(state, file)


def test_a_parameter_no_saved_rank_holds(split_critic: tuple[Path, dict[str, Any]]) -> None:
    path, _ = split_critic
    for file in _rank_files(path):
        _edit(file, lambda s: s["model"].pop("norm.weight"))
    with pytest.raises(
        CheckpointError,
        match=r"load_checkpoint \(rank 0\): .*three/v000001: no saved rank holds "
        r"\['norm.weight'\] \(1 of this rank's 22 parameters\)",
    ):
        _critic().load_checkpoint(str(path))


def test_saved_blocks_that_leave_a_gap(split_critic: tuple[Path, dict[str, Any]]) -> None:
    path, _ = split_critic
    _edit(_rank_files(path)[1], lambda s: s["model"].pop("layers.0.mlp.up_proj.weight"))
    with pytest.raises(
        CheckpointError,
        match=r"load_checkpoint \(rank 0\): .*three/v000001: the saved blocks of "
        r"layers.0.mlp.up_proj.weight cover 1376 of 2048 elements of the block \[0:64, 0:32\] "
        r"being built \(saved blocks: rank_00000_of_00003.pt \[0:22, 0:32\], "
        r"rank_00002_of_00003.pt \[43:64, 0:32\]\)",
    ):
        _critic().load_checkpoint(str(path))


def test_optimizer_moments_that_leave_a_gap(split_critic: tuple[Path, dict[str, Any]]) -> None:
    path, _ = split_critic

    def drop(state: dict[str, Any]) -> None:  # rank 2 has no optimizer state for norm.weight
        del state["optim"]["state"][state["optim_param_names"].index("norm.weight")]

    _edit(_rank_files(path)[2], drop)
    with pytest.raises(
        CheckpointError,
        match=r"the saved blocks of exp_avg of norm.weight cover 22 of 32 elements of the "
        r"block \[0:32\] being built \(saved blocks: rank_00000_of_00003.pt \[0:11\], "
        r"rank_00001_of_00003.pt \[11:22\]\)",
    ):
        _critic().load_checkpoint(str(path))

    def lose(state: dict[str, Any]) -> None:  # and rank 1's exp_avg_sq of it is not a block
        entry = state["optim"]["state"][state["optim_param_names"].index("norm.weight")]
        entry["exp_avg_sq"] = entry["exp_avg_sq"][:3]

    _edit(_rank_files(path)[1], lose)
    _edit(_rank_files(path)[2], lambda s: s.pop("optim_param_names"))
    with pytest.raises(CheckpointError, match=r"rank_00002_of_00003.pt does not name its optim"):
        _critic().load_checkpoint(str(path))


def test_a_checkpoint_of_another_model(
    single_rank: None, split_critic: tuple[Path, dict[str, Any]]
) -> None:
    path, _ = split_critic
    cfg = critic_config()
    bigger = CriticWorker(
        dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hidden_size=64))
    )
    bigger.init_model()
    with pytest.raises(
        CheckpointError, match=r"rank_00000_of_00003.pt: \S+ has full shape \[\d+, 32\], expected"
    ):
        bigger.load_checkpoint(str(path))


def test_an_old_format_checkpoint_loads_only_at_its_own_layout(
    split_critic: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    path, _ = split_critic
    meta_file = path / "v000001" / "meta.json"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "format": 1}))
    with pytest.raises(
        CheckpointError,
        match=r"written with world size 3 \(dp 3, tp 1\) and other blocks than this group's, "
        r"world size 1 \(dp 1, tp 1\); its format 1 does not name the optimizer's parameters",
    ):
        _critic().load_checkpoint(str(path))
    # at its own layout a format-1 checkpoint (no optim_param_names) still loads
    one = tmp_path / "one" / "v000001"
    _edit(one / "rank_00000_of_00001.pt", lambda s: s.pop("optim_param_names"))
    meta = json.loads((one / "meta.json").read_text())
    for key in ("pp_size", "sp_size"):
        meta.pop(key)
    (one / "meta.json").write_text(json.dumps({**meta, "format": 1}))
    critic = _critic()
    critic.load_checkpoint(str(tmp_path / "one"))
    _, expected = split_critic
    assert critic.update_critic(_batch(2)).meta_info["metrics"] == expected["metrics"]


# ------------------------------------------------- real multi-rank saves, other layouts

#: one launch per world size, in order: each loads what the earlier ones saved
LAUNCHES: list[tuple[int, list[Step]]] = [
    (
        2,
        [
            ("save", "fsdp", 1, "fsdp_dp2", "fsdp_dp2"),
            ("load", "megatron", 2, "fsdp_dp2", "fsdp_dp2_to_megatron_tp2_dp1"),
        ],
    ),
    (
        4,
        [
            ("save", "megatron", 2, "megatron_tp2_dp2", "megatron_tp2_dp2"),
            ("load", "fsdp", 1, "fsdp_dp2", "fsdp_dp2_to_fsdp_dp4"),
            ("load", "megatron", 1, "megatron_tp2_dp2", "megatron_tp2_dp2_to_megatron_tp1_dp4"),
        ],
    ),
    (
        2,
        [
            ("load", "megatron", 2, "megatron_tp2_dp2", "megatron_tp2_dp2_to_megatron_tp2_dp1"),
            ("load", "fsdp", 1, "megatron_tp2_dp2", "megatron_tp2_dp2_to_fsdp_dp2"),
        ],
    ),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("reshard")
    for world, steps in LAUNCHES:
        launch(functools.partial(reshard_job, steps), world=world, out=out, timeout=240)
    results = {p.stem: torch.load(p, weights_only=False) for p in out.glob("*.pt")}
    with pytest.MonkeyPatch.context() as mp:  # and world size 1, in this process
        mp.setenv("WORLD_SIZE", "1")
        mp.setenv("RANK", "0")
        results["fsdp_dp2_to_fsdp_dp1"] = load_and_update("fsdp", 1, out / "fsdp_dp2")
    return results


def _check(runs: dict[str, dict[str, Any]], saved: str, loaded: str) -> None:
    expected, got = runs[saved], runs[loaded]
    assert got["names"] == expected["names"]
    assert set(got["loaded"]) == set(expected["saved"])
    for name, tensor in expected["saved"].items():  # the load is a copy: bit for bit
        assert torch.equal(got["loaded"][name], tensor), name
    for name, tensor in expected["weights"].items():
        torch.testing.assert_close(got["weights"][name], tensor, atol=ATOL, rtol=0, msg=name)
    assert any(not torch.equal(t, expected["saved"][n]) for n, t in expected["weights"].items())
    assert set(got["metrics"]) == set(expected["metrics"])
    for name, value in expected["metrics"].items():
        assert got["metrics"][name] == pytest.approx(value, rel=ATOL, abs=ATOL), name
    assert got["metrics"]["actor/lr"] == pytest.approx(1e-2 * 2 / 3)  # the schedule resumed


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("saved", "loaded"),
    [
        ("fsdp_dp2", "fsdp_dp2_to_fsdp_dp1"),
        ("fsdp_dp2", "fsdp_dp2_to_fsdp_dp4"),
        ("fsdp_dp2", "fsdp_dp2_to_megatron_tp2_dp1"),
        ("megatron_tp2_dp2", "megatron_tp2_dp2_to_megatron_tp1_dp4"),
        ("megatron_tp2_dp2", "megatron_tp2_dp2_to_megatron_tp2_dp1"),
        ("megatron_tp2_dp2", "megatron_tp2_dp2_to_fsdp_dp2"),
    ],
)
def test_a_checkpoint_loads_into_another_layout(
    runs: dict[str, dict[str, Any]], saved: str, loaded: str
) -> None:
    _check(runs, saved, loaded)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_layouts_make_the_same_updates(runs: dict[str, dict[str, Any]]) -> None:
    """fsdp and megatron name the parameters alike, and their runs agree with each other."""
    fsdp, megatron = runs["fsdp_dp2"], runs["megatron_tp2_dp2"]
    assert fsdp["names"] == megatron["names"]
    for name, tensor in fsdp["weights"].items():
        torch.testing.assert_close(megatron["weights"][name], tensor, atol=2e-5, rtol=0, msg=name)


#: a checkpoint of a pipelined run (PP 2 x DP 2, each stage's files holding its own layers)
#: loaded without stages (PP 1 x DP 4) and at PP 2 x TP 2, in one world of 4
PIPELINE_STEPS = [
    ("save", 1, 2, "pp2_dp2", "pp2_dp2"),
    ("load", 1, 1, "pp2_dp2", "pp2_dp2_to_pp1_dp4"),
    ("load", 2, 2, "pp2_dp2", "pp2_dp2_to_pp2_tp2"),
]


@pytest.fixture(scope="module")
def pipeline_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("reshard-pp")
    launch(functools.partial(pipeline_reshard_job, PIPELINE_STEPS), world=4, out=out, timeout=300)
    return {p.stem: torch.load(p, weights_only=False) for p in out.glob("*.pt")}


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(900)
@pytest.mark.parametrize("loaded", ["pp2_dp2_to_pp1_dp4", "pp2_dp2_to_pp2_tp2"])
def test_a_pipelined_checkpoint_loads_into_another_layout(
    pipeline_runs: dict[str, dict[str, Any]], loaded: str
) -> None:
    """Saved at PP 2 x DP 2: loaded at PP 1 x DP 4 and at PP 2 x TP 2, the weights are the
    saved ones bit for bit and the next update equals the run that never changed layout."""
    _check(pipeline_runs, "pp2_dp2", loaded)
