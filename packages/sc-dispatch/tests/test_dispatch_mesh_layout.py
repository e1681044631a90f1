"""MeshLayout, ask_mesh_layout and the shipped fake worker group (sc_dispatch.testing)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import sc_dispatch as scd
from sc_dispatch import DispatchArgumentError, MeshLayoutError
from sc_dispatch.ext import MeshLayout, ask_mesh_layout
from sc_dispatch.testing import FakeWorkerGroup


def test_a_layout_holds_tuples_and_tells_its_groups() -> None:
    layout = MeshLayout([1, 0, 0, 1], [True, False, True, False], mesh_name="actor")  # type: ignore[arg-type]
    assert layout.dp_ranks == (1, 0, 0, 1)
    assert layout.collect == (True, False, True, False)
    assert (layout.world_size, layout.dp_size) == (4, 2)
    assert layout.dp_groups == ((1, 2), (0, 3))
    assert layout.collect_ranks == (2, 0)
    # the name is for messages: equal layouts of different meshes compare equal
    assert layout == MeshLayout((1, 0, 0, 1), (True, False, True, False))
    assert hash(layout) == hash(MeshLayout((1, 0, 0, 1), (True, False, True, False)))


def test_from_sizes_is_dp_by_tp_with_tp_innermost() -> None:
    layout = MeshLayout.from_sizes(2, 3, mesh_name="m")
    assert layout.dp_ranks == (0, 0, 0, 1, 1, 1)
    assert layout.collect == (True, False, False, True, False, False)
    assert layout.mesh_name == "m"
    assert MeshLayout.from_sizes(3) == MeshLayout((0, 1, 2), (True, True, True))


@pytest.mark.parametrize(
    ("sizes", "match"),
    [((0, 1), r"dp_size must be an int >= 1, got 0"), ((2, True), r"tp_size .* got True")],
)
def test_from_sizes_refuses_bad_sizes(sizes: tuple[Any, Any], match: str) -> None:
    with pytest.raises(MeshLayoutError, match=match):
        MeshLayout.from_sizes(*sizes)


@pytest.mark.parametrize(
    ("dp_ranks", "collect", "match"),
    [
        ((), (), r"mesh 'm': the mesh has no ranks"),
        ((0, 1), (True,), r"mesh 'm': expected one collect flag per dp rank, got 2 dp ranks"),
        ((0, 2), (True, True), r"mesh 'm': dp ranks must be exactly 0\.\.2, got \[0, 2\]"),
        ((-1, 0), (True, True), r"got \[-1, 0\]"),
        (
            (0, "1"),
            (True, True),
            r"mesh 'm': dp ranks must be ints; got \(rank: value\) \{1: '1'\}",
        ),
        ((0, True), (True, True), r"\{1: True\}"),
        ((0, 1), (True, 1), r"collect flags must be bools; got \(rank: value\) \{1: 1\}"),
        (
            (0, 0),
            (True, True),
            r"mesh 'm': every dp group needs exactly one collect rank; "
            r"dp rank 0: collect ranks \[0, 1\]",
        ),
    ],
)
def test_a_bad_layout_is_refused_naming_the_mesh_and_the_ranks(
    dp_ranks: tuple[Any, ...], collect: tuple[Any, ...], match: str
) -> None:
    with pytest.raises(MeshLayoutError, match=match):
        MeshLayout(dp_ranks, collect, mesh_name="m")


def test_an_unnamed_layout_says_so_and_the_name_must_be_a_str() -> None:
    with pytest.raises(MeshLayoutError, match=r"^mesh layout: the mesh has no ranks"):
        MeshLayout((), ())
    with pytest.raises(MeshLayoutError, match=r"mesh_name must be a str, got 3"):
        MeshLayout((0,), (True,), mesh_name=3)  # type: ignore[arg-type]


def test_ask_mesh_layout_builds_a_named_layout_from_the_per_rank_queries() -> None:
    asked: list[str] = []

    def dp(mesh: str) -> list[int | None]:
        asked.append(mesh)
        return [0, 0, 1, 1]

    layout = ask_mesh_layout("a", 4, dp, lambda m: [True, False, True, False])
    assert layout == MeshLayout.from_sizes(2, 2)
    assert layout.mesh_name == "a"
    assert asked == ["a"]


@pytest.mark.parametrize(
    ("dp", "collect", "match"),
    [
        ([0, 1], [True, True], r"mesh 'a': expected one dp rank .* \(world size 3\), got 2 dp"),
        ([None] * 3, [None] * 3, r"no rank registered the mesh 'a'"),
        ([0, None, 1], [True, None, True], r"ranks \[1\] did not register the mesh 'a'"),
    ],
)
def test_ask_mesh_layout_errors(dp: list[Any], collect: list[Any], match: str) -> None:
    with pytest.raises(MeshLayoutError, match=match):
        ask_mesh_layout("a", 3, lambda m: dp, lambda m: collect)


def test_ask_mesh_layout_turns_a_workers_key_error_into_one_error() -> None:
    def unknown(mesh: str) -> list[int | None]:
        raise KeyError(f"mesh {mesh!r} was never registered")

    with pytest.raises(MeshLayoutError, match=r"some rank did not register the mesh 'a'.*never"):
        ask_mesh_layout("a", 2, unknown, lambda m: [True, True])
    with pytest.raises(DispatchArgumentError, match=r"ask_mesh_layout: mesh_name must be a non"):
        ask_mesh_layout("", 2, unknown, lambda m: [True, True])


def test_the_fake_meets_the_protocol_and_caches_each_mesh() -> None:
    wg = FakeWorkerGroup(
        4, {"actor": MeshLayout.from_sizes(2, 2), "raw": ([0, 1, 2, 3], [True] * 4)}
    )
    assert isinstance(wg, scd.ext.DispatchWorkerGroup)
    assert wg.world_size == 4
    first = wg.query_mesh("actor")
    assert first.mesh_name == "actor"
    assert wg.query_mesh("actor") is first
    assert wg.query_mesh("raw").dp_size == 4
    assert wg.mesh_queries == {"actor": 1, "raw": 1}
    assert set(wg.mesh_cache) == {"actor", "raw"}
    assert "FakeWorkerGroup(world_size=4, meshes=['actor', 'raw']" in repr(wg)


def test_the_fake_checks_raw_answers_when_asked_and_caches_nothing_invalid() -> None:
    wg = FakeWorkerGroup(2, {"m": ([0, 0], [True, True])})
    for _ in range(2):
        with pytest.raises(MeshLayoutError, match=r"mesh 'm': every dp group needs exactly one"):
            wg.query_mesh("m")
    assert wg.mesh_queries == {"m": 2}
    assert wg.mesh_cache == {}


def test_the_fake_has_dead_ranks() -> None:
    wg = FakeWorkerGroup(3, dead_ranks=[2, 0, 2])
    assert wg.dead_ranks == [0, 2]
    wg.dead_ranks.append(1)
    assert FakeWorkerGroup(1).dead_ranks == []


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((0,), {}, r"FakeWorkerGroup: world_size must be an int >= 1, got 0"),
        (("2",), {}, r"world_size must be an int >= 1, got '2'"),
        ((2,), {"dead_ranks": [2, "x"]}, r"dead_ranks must be ranks 0\.\.1, got \[2, 'x'\]"),
        ((2, {"": MeshLayout.from_sizes(2)}), {}, r"FakeWorkerGroup: mesh_name must be a non"),
        ((2, {"m": [0, 1]}), {}, r"mesh 'm' must be a MeshLayout or a pair .* got list"),
    ],
)
def test_the_fake_refuses_bad_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(DispatchArgumentError, match=match):
        FakeWorkerGroup(*args, **kwargs)


def test_the_worker_group_protocol_has_public_members_only() -> None:
    members = {
        name
        for name, value in vars(scd.ext.DispatchWorkerGroup).items()
        if (callable(value) or isinstance(value, property)) and not name.startswith("__")
    }
    assert members == {"world_size", "query_mesh"}
    assert not vars(scd.ext.DispatchWorkerGroup).get("__annotations__")


def test_sc_dispatch_never_reads_verls_private_mesh_protocol() -> None:
    """The N-d modes read meshes through query_mesh only (verl's names stay on sc-core's
    group and worker for verl's own code)."""
    private = {"_query_dispatch_info", "_query_collect_info", "_dispatch_info", "_collect_info"}
    package = Path(scd.__file__).resolve().parent
    found = [
        f"{path.name}:{node.lineno} {node.attr}"
        for path in sorted(package.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr in private
    ]
    assert found == []
