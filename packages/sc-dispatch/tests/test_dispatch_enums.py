"""DynamicEnum, Dispatch and Execute."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator

import pytest
from _dispatch_fakes import unique_name
from sc_dispatch import (
    Dispatch,
    DispatchModeExistsError,
    Execute,
    InvalidDispatchModeError,
    UnknownDispatchModeError,
)
from sc_dispatch.verl import DynamicEnum

VERL_DISPATCH = [
    "RANK_ZERO",
    "ONE_TO_ALL",
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_PROTO",
    "DP_COMPUTE_PROTO_WITH_FUNC",
    "DP_COMPUTE_METRIC",
    "DIRECT_ROLLOUT_METHOD",
]


class Color(DynamicEnum):
    """A DynamicEnum of the tests' own, to check per-subclass registries."""


class Shade(Color):
    """A subclass of a subclass: a registry of its own again."""


@pytest.fixture
def color() -> Iterator[type[Color]]:
    yield Color
    for member in list(Color):
        Color.remove(member.name)
    for member in list(Shade):
        Shade.remove(member.name)


def test_dispatch_has_verls_members_in_order() -> None:
    assert [m.name for m in Dispatch][: len(VERL_DISPATCH)] == VERL_DISPATCH
    assert [m.value for m in Dispatch][: len(VERL_DISPATCH)] == list(range(len(VERL_DISPATCH)))
    assert [m.name for m in Execute][:2] == ["ALL", "RANK_ZERO"]


def test_members_are_reachable_three_ways() -> None:
    assert Dispatch.DP_COMPUTE_PROTO is Dispatch["DP_COMPUTE_PROTO"]
    assert Dispatch.DP_COMPUTE_PROTO is Dispatch.from_name("DP_COMPUTE_PROTO")
    assert Execute.RANK_ZERO is Execute.from_name("RANK_ZERO")
    execute_rank_zero: object = Execute.RANK_ZERO
    assert execute_rank_zero is not Dispatch.RANK_ZERO
    assert execute_rank_zero != Dispatch.RANK_ZERO


def test_register_remove_contains_and_len(color: type[Color]) -> None:
    assert len(color) == 0
    red = color.register("RED")
    green = color.register("GREEN")
    assert isinstance(red, Color)
    assert (red.name, red.value, green.value) == ("RED", 0, 1)
    assert color.RED is red  # type: ignore[attr-defined]
    assert "RED" in color
    assert red in color
    assert list(color) == [red, green]
    assert len(color) == 2
    assert repr(red) == "<Color.RED: 0>"
    assert color.remove("RED") is red
    assert "RED" not in color
    assert red not in color
    assert not hasattr(color, "RED")
    assert list(color) == [green]
    with pytest.raises(UnknownDispatchModeError, match=r"Color.remove: no member 'RED'"):
        color.remove("RED")
    # Values keep growing: a removed member's value is never reused.
    assert color.register("BLUE").value == 2


def test_contains_rejects_look_alikes(color: type[Color]) -> None:
    color.register("RED")
    impostor = Color("RED", 0)
    assert impostor not in color
    assert 3 not in color
    assert Dispatch.ONE_TO_ALL not in color


def test_iteration_is_a_snapshot(color: type[Color]) -> None:
    color.register("A")
    color.register("B")
    seen = []
    for member in color:
        seen.append(member.name)
        color.remove(member.name)
    assert seen == ["A", "B"]


def test_registries_are_per_subclass(color: type[Color]) -> None:
    red = color.register("RED")
    assert "RED" not in Dispatch
    assert "RED" not in Shade
    assert "ONE_TO_ALL" not in color
    dark = Shade.register("DARK")
    assert "DARK" not in color
    assert isinstance(dark, Shade)
    assert Shade.from_name("DARK") is dark
    assert Shade.from_name("RED") is None
    with pytest.raises(KeyError, match="Shade has no member 'RED'"):
        Shade["RED"]
    assert color.from_name("RED") is red


def test_duplicate_names_are_rejected(color: type[Color]) -> None:
    color.register("RED")
    with pytest.raises(DispatchModeExistsError, match=r"Color.register: member 'RED' already"):
        color.register("RED")
    with pytest.raises(DispatchModeExistsError, match=r"'DP_COMPUTE' already exists"):
        Dispatch.register("DP_COMPUTE")


@pytest.mark.parametrize("name", ["", "two words", "1ST"])
def test_names_must_be_identifiers(color: type[Color], name: str) -> None:
    with pytest.raises(InvalidDispatchModeError, match=r"must be an identifier, got") as info:
        color.register(name)
    assert isinstance(info.value, ValueError)
    assert not isinstance(info.value, TypeError)
    assert len(color) == 0


@pytest.mark.parametrize("name", [5, None, b"RED"])
def test_names_must_be_strings(color: type[Color], name: object) -> None:
    with pytest.raises(TypeError, match=r"member name must be a str"):
        color.register(name)  # type: ignore[arg-type]
    assert len(color) == 0


class Palette(DynamicEnum):
    """A DynamicEnum with an upper-case class attribute that a member must not hide."""

    DEFAULT = "a class attribute, not a member"


@pytest.mark.parametrize("name", ["default", "DEFAULT", "Default"])
def test_names_may_not_shadow_class_attributes(name: str) -> None:
    with pytest.raises(InvalidDispatchModeError, match=r"member name 'DEFAULT' would shadow"):
        Palette.register(name)
    assert len(Palette) == 0
    assert Palette.DEFAULT == "a class attribute, not a member"


def test_verl_semantics_upper_case_names_and_lookups(color: type[Color]) -> None:
    red = color.register("red")
    assert red.name == "RED"
    assert color.RED is red  # type: ignore[attr-defined]
    assert color.from_name("red") is red
    assert color.from_name("ReD") is red
    assert color.from_name("blue") is None
    assert color["RED"] is red
    with pytest.raises(KeyError, match=r"Color has no member 'red'"):
        color["red"]  # indexing is exact, as in verl
    with pytest.raises(ValueError, match=r"member 'RED' already exists"):
        color.register("Red")
    green = color.register("GREEN")
    assert green.value == red.value + 1
    assert color.names() == ["RED", "GREEN"]
    assert color.values() == [red, green]
    assert Dispatch.names()[:2] == ["RANK_ZERO", "ONE_TO_ALL"]
    assert color.remove("green") is green
    with pytest.raises(KeyError, match=r"Color.remove: no member 'green'"):
        color.remove("green")


def test_a_new_subclass_counts_its_values_from_zero() -> None:
    class Fresh(DynamicEnum):
        pass

    assert [Fresh.register(n).value for n in ("a", "b", "c")] == [0, 1, 2]
    assert Fresh.names() == ["A", "B", "C"]
    assert Dispatch.RANK_ZERO.value == 0


def test_user_subclass_pickles_to_the_same_member(color: type[Color]) -> None:
    red = color.register("RED")
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(red, protocol=protocol)) is red


def test_pickling_returns_the_same_singleton() -> None:
    for member in [*Dispatch, *Execute]:
        for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
            assert pickle.loads(pickle.dumps(member, protocol=protocol)) is member
    assert copy.deepcopy(Dispatch.DP_COMPUTE) is Dispatch.DP_COMPUTE
    assert copy.copy(Execute.ALL) is Execute.ALL


def test_new_members_at_run_time_pickle_and_hash() -> None:
    name = unique_name("RUNTIME")
    member = Dispatch.register(name)
    try:
        assert getattr(Dispatch, name) is member
        assert pickle.loads(pickle.dumps(member)) is member
        assert {member: 1}[Dispatch.from_name(name)] == 1
        assert member.value == max(m.value for m in Dispatch)
    finally:
        Dispatch.remove(name)
    with pytest.raises(UnknownDispatchModeError) as info:
        pickle.loads(pickle.dumps(member))
    assert isinstance(info.value, KeyError)
