"""Padding: the global switch, the per-object flag, and the padding helpers."""

from __future__ import annotations

import pytest
from _protocol_helpers import make_dp, row_ids
from sc_protocol import DataProtoConfig, pad_dataproto_to_divisor, unpad_dataproto


def test_padding_disabled_by_default() -> None:
    assert DataProtoConfig.auto_padding is False
    assert not make_dp(2).is_padding_enabled()


@pytest.mark.parametrize(
    ("raw", "expected"), [("1", True), ("TRUE", True), ("on", True), ("0", False), ("", False)]
)
def test_env_switch(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv("SC_PROTOCOL_AUTO_PADDING", raw)
    assert DataProtoConfig.auto_padding is expected
    assert make_dp(2).is_padding_enabled() is expected


def test_the_0_1_variable_name_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SC_AUTO_PADDING", "yes")
    assert DataProtoConfig.auto_padding is False


def _on() -> bool:
    """The global switch, read through a call (so the type checker does not narrow it)."""
    return DataProtoConfig.auto_padding


def test_env_turns_padding_on_even_after_assigning_false(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's rule: the environment variable OR the assigned value."""
    DataProtoConfig.auto_padding = False
    assert _on() is False
    monkeypatch.setenv("SC_PROTOCOL_AUTO_PADDING", "1")
    assert make_dp(3).is_padding_enabled()
    assert _on() is True
    monkeypatch.setenv("SC_PROTOCOL_AUTO_PADDING", "0")
    assert _on() is False
    DataProtoConfig.auto_padding = True
    assert _on() is True
    DataProtoConfig.auto_padding = None
    assert _on() is False


def test_per_object_flag() -> None:
    dp = make_dp(2, meta={DataProtoConfig.auto_padding_key: True})
    assert dp.is_padding_enabled()
    assert not make_dp(2).is_padding_enabled()
    # The flag travels with the chunks, as the meta_info does.
    assert all(part.is_padding_enabled() for part in dp.chunk(2))


def test_pad_to_divisor_cycles_rows_and_does_not_mutate() -> None:
    dp = make_dp(3)
    padded, pad = pad_dataproto_to_divisor(dp, 8)
    assert pad == 5
    assert row_ids(padded) == [0, 1, 2, 0, 1, 2, 0, 1]
    assert list(padded.non_tensor_batch["uid"])[-1] == "u1"
    assert len(dp) == 3
    assert row_ids(unpad_dataproto(padded, pad)) == [0, 1, 2]


def test_pad_to_divisor_no_op() -> None:
    dp = make_dp(4)
    same, pad = pad_dataproto_to_divisor(dp, 2)
    assert same is dp
    assert pad == 0
    assert unpad_dataproto(dp, 0) is dp
    empty = make_dp(0)
    assert pad_dataproto_to_divisor(empty, 3) == (empty, 0)


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [("", [0, 1, 2, 2, 2]), ("first", [0, 1, 2, 0, 0]), ("last", [0, 1, 2, 2, 2])],
)
def test_padding_in_place(candidate: str, expected: list[int]) -> None:
    """verl: the default candidate is the last row; "first" repeats the first row."""
    dp = make_dp(3)
    dp.padding(2, candidate)
    assert row_ids(dp) == expected
    assert len(dp.non_tensor_batch["uid"]) == 5
    dp.padding(0)
    assert len(dp) == 5
