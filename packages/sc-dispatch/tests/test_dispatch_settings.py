"""Setting: one grammar per type, the environment it reads, errors, deprecated names."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import sc_dispatch
import sc_dispatch._setting as setting_module
from hypothesis import given
from hypothesis import strategies as st
from sc_dispatch._setting import (
    Setting,
    SettingDeclarationError,
    SettingValueError,
    parse_bool,
    parse_int,
    parse_path,
    parse_seconds,
    parse_str,
)

_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("0", "false", "no", "off")


def _any_case(word: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda upper: "".join(c.upper() if u else c for c, u in zip(word, upper, strict=True))
    )


@given(
    value=st.booleans(),
    word=st.data(),
    pad=st.sampled_from(["", " ", "\t", "  \n"]),
)
def test_bool_grammar_round_trip(value: bool, word: st.DataObject, pad: str) -> None:
    spelled = word.draw(st.sampled_from(_TRUE_WORDS if value else _FALSE_WORDS).flatmap(_any_case))
    flag = Setting("SC_TEST_FLAG", parse_bool, not value, "a flag")
    assert flag.get({"SC_TEST_FLAG": pad + spelled + pad}) is value


@given(st.text(min_size=1).filter(lambda s: s.strip().lower() not in {*_TRUE_WORDS, *_FALSE_WORDS}))
def test_any_other_word_is_not_a_bool(raw: str) -> None:
    flag = Setting("SC_TEST_FLAG", parse_bool, False, "a flag")
    if not raw.strip():
        assert flag.get({"SC_TEST_FLAG": raw}) is False  # blank is unset
        return
    with pytest.raises(SettingValueError) as info:
        flag.get({"SC_TEST_FLAG": raw})
    assert "SC_TEST_FLAG=" in str(info.value)
    assert repr(raw) in str(info.value)
    assert isinstance(info.value, ValueError)


@given(st.floats(min_value=1e-6, max_value=1e9, allow_nan=False))
def test_seconds_round_trip(value: float) -> None:
    timeout = Setting("SC_TEST_TIMEOUT_S", parse_seconds, 1.0, "a timeout")
    assert timeout.get({"SC_TEST_TIMEOUT_S": repr(value)}) == value


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "nan", "inf", "1e999", "1s"])
def test_bad_seconds_name_the_variable_and_value(raw: str) -> None:
    timeout = Setting("SC_TEST_TIMEOUT_S", parse_seconds, 1.0, "a timeout")
    with pytest.raises(
        SettingValueError, match=f"SC_TEST_TIMEOUT_S={raw!r} is not a valid seconds"
    ):
        timeout.get({"SC_TEST_TIMEOUT_S": raw})


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_int_round_trip(value: int) -> None:
    count = Setting("SC_TEST_COUNT", parse_int, 0, "a count")
    assert count.get({"SC_TEST_COUNT": f" {value} "}) == value


def test_int_str_and_path() -> None:
    with pytest.raises(SettingValueError, match=r"'1\.5' is not a valid int"):
        Setting("SC_TEST_COUNT", parse_int, 0, "a count").get({"SC_TEST_COUNT": "1.5"})
    name = Setting("SC_TEST_NAME", parse_str, None, "a name")
    assert name.get({"SC_TEST_NAME": "  mod:factory "}) == "mod:factory"
    where = Setting("SC_TEST_FILE", parse_path, None, "a file")
    assert where.get({"SC_TEST_FILE": "~/t.json"}) == Path.home() / "t.json"
    assert where.get({}) is None
    assert [s.type_name for s in (name, where)] == ["str", "path"]


def test_unset_and_blank_give_the_default() -> None:
    timeout = Setting("SC_TEST_TIMEOUT_S", parse_seconds, 300.0, "a timeout")
    assert timeout.get({}) == 300.0
    assert timeout.get({"SC_TEST_TIMEOUT_S": "   "}) == 300.0
    assert timeout.raw({"SC_TEST_TIMEOUT_S": "2"}) == ("SC_TEST_TIMEOUT_S", "2")


def test_reads_os_environ_by_default_and_the_given_mapping_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timeout = Setting("SC_TEST_TIMEOUT_S", parse_seconds, 300.0, "a timeout")
    monkeypatch.setenv("SC_TEST_TIMEOUT_S", "5")
    assert timeout.get() == 5.0
    assert timeout.get({}) == 300.0  # a worker's own environment, not the driver's
    assert timeout.get({"SC_TEST_TIMEOUT_S": "7"}) == 7.0


def test_deprecated_name_works_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(setting_module, "_warned", set())
    timeout = Setting(
        "SC_TEST_NEW_TIMEOUT_S", parse_seconds, 300.0, "a timeout", deprecated=("SC_TEST_OLD",)
    )
    assert timeout.names == ("SC_TEST_NEW_TIMEOUT_S", "SC_TEST_OLD")
    with caplog.at_level(logging.WARNING, logger="sc_dispatch.settings"):
        assert timeout.get({"SC_TEST_OLD": "4"}) == 4.0
        assert timeout.get({"SC_TEST_OLD": "4"}) == 4.0
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "environment variable SC_TEST_OLD is deprecated: set SC_TEST_NEW_TIMEOUT_S instead"
    ]
    # The current name wins over the former one.
    assert timeout.get({"SC_TEST_OLD": "4", "SC_TEST_NEW_TIMEOUT_S": "6"}) == 6.0
    with pytest.raises(
        SettingValueError, match=r"SC_TEST_OLD='x' \(deprecated name of SC_TEST_NEW"
    ):
        timeout.get({"SC_TEST_OLD": "x"})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "TIMEOUT"}, "upper-case SC_"),
        ({"name": "sc_lower"}, "upper-case SC_"),
        ({"deprecated": ("OLD",)}, "upper-case SC_"),
        ({"deprecated": ["SC_OLD"]}, "tuple"),
        ({"deprecated": ("SC_TEST_X_S",)}, "repeat"),
        ({"name": "SC_TEST_TIMEOUT"}, "named ..._S"),
        ({"doc": "  "}, "doc"),
        ({"parse": 3}, "callable"),
    ],
)
def test_bad_declarations_are_refused(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "name": "SC_TEST_X_S",
        "parse": parse_seconds,
        "default": 1.0,
        "doc": "x",
    }
    args.update(kwargs)
    with pytest.raises(SettingDeclarationError, match=match):
        Setting(**args)  # type: ignore[arg-type]


def test_one_parser_per_type() -> None:
    assert parse_bool(" On ") is True
    assert math.isclose(parse_seconds("0.25"), 0.25)
    assert parse_int("-3") == -3
    assert parse_str(" a ") == "a"
    assert parse_path("/x") == Path("/x")
    names = [
        Setting(n, p, None, "d").type_name
        for n, p in [
            ("SC_A", parse_bool),
            ("SC_B_S", parse_seconds),
            ("SC_C", parse_int),
            ("SC_D", parse_str),
            ("SC_E", parse_path),
        ]
    ]
    assert names == ["bool", "seconds", "int", "str", "path"]

    def parse_choice(raw: str) -> str:
        return raw

    assert Setting("SC_F", parse_choice, "", "d").type_name == "choice"


def test_sc_dispatch_reads_no_variable_itself() -> None:
    # so it has no SETTINGS tuple: the settings page lists the other packages' (the framework
    # itself is private, shared by the sc distributions)
    assert not hasattr(sc_dispatch, "SETTINGS")
    assert "Setting" not in sc_dispatch.__all__
