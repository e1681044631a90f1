"""payload_nbytes: byte estimates from hooks, adapters, bytes-likes and containers."""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import Any

import pytest
import sc_dispatch as scd
from _dispatch_fakes import BATCH_ADAPTER, PROPERTY, Batch
from hypothesis import given
from hypothesis import strategies as st
from sc_dispatch import ext


class Blob:
    """A non-shardable payload type, sized through a hook."""

    def __init__(self, size: int) -> None:
        self.size = size


class SubBlob(Blob):
    pass


class Sized:
    """A shardable container whose adapter knows its bytes (8 per row)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows


class SizedAdapter:
    def length(self, obj: Sized) -> int:
        return obj.rows

    def chunk(self, obj: Sized, chunks: int) -> list[Sized]:
        return [Sized(n) for n in ext.chunk_sizes(obj.rows, chunks)]

    def concat(self, parts: Sequence[Sized]) -> Sized:
        return Sized(sum(p.rows for p in parts))

    def pad(self, obj: Sized, pad_size: int) -> Sized:
        return Sized(obj.rows + pad_size)

    def unpad(self, obj: Sized, pad_size: int) -> Sized:
        return Sized(obj.rows - pad_size)

    def auto_padding(self, obj: Sized) -> bool:
        return False

    def nbytes(self, obj: Sized) -> int:
        return 8 * obj.rows


SIZED: ext.SizedShardAdapter[Sized] = SizedAdapter()
ext.register_shardable(Sized, SIZED)
ext.register_nbytes(Blob, lambda blob: blob.size)


def _view(data: bytes) -> memoryview:
    return memoryview(data)


bytes_likes = st.one_of(
    st.binary(max_size=64),
    st.binary(max_size=64).map(bytearray),
    st.binary(max_size=64).map(_view),
)


@PROPERTY
@given(data=bytes_likes)
def test_bytes_likes_weigh_their_length(data: bytes | bytearray | memoryview) -> None:
    assert ext.payload_nbytes(data) == len(data)


def test_a_memoryview_weighs_its_bytes_not_its_items() -> None:
    view = memoryview(array.array("d", [1.0, 2.0, 3.0]))
    assert len(view) == 3
    assert ext.payload_nbytes(view) == 24
    assert ext.payload_nbytes(view[1:]) == 16  # a slice weighs only what it sees


payloads = st.recursive(
    bytes_likes | st.integers(0, 1000).map(Blob) | st.integers(0, 50).map(Sized),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=3), inner, max_size=4),
    ),
    max_leaves=12,
)


def expected(obj: Any, depth: int) -> int:
    if isinstance(obj, Blob):
        return obj.size
    if isinstance(obj, Sized):
        return 8 * obj.rows
    if isinstance(obj, memoryview):
        return obj.nbytes
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if depth == 0:
        return 0
    items = obj.values() if isinstance(obj, dict) else obj
    return sum(expected(v, depth - 1) for v in items)


@PROPERTY
@given(obj=payloads, depth=st.integers(0, 6))
def test_containers_add_up_their_items_down_to_the_depth(obj: Any, depth: int) -> None:
    assert ext.payload_nbytes(obj, max_depth=depth) == expected(obj, depth)


@PROPERTY
@given(obj=payloads)
def test_the_estimate_is_never_negative_and_depth_only_adds(obj: Any) -> None:
    sizes = [ext.payload_nbytes(obj, max_depth=d) for d in range(6)]
    assert all(s >= 0 for s in sizes)
    assert sizes == sorted(sizes)


@pytest.mark.parametrize(
    "obj", [None, 0, 3.5, True, "a long string", object(), {1, 2}, Batch([1, 2]), 1j]
)
def test_unknown_objects_weigh_nothing(obj: Any) -> None:
    assert ext.payload_nbytes(obj) == 0


def test_an_adapter_without_nbytes_is_not_used() -> None:
    assert not hasattr(BATCH_ADAPTER, "nbytes")
    assert ext.get_nbytes_fn(Batch([1])) is None
    assert ext.get_nbytes_fn(Sized(1)) is not None


def test_rows_and_plain_sequences_are_entered() -> None:
    assert ext.payload_nbytes(scd.Rows([b"ab", b"cde"])) == 5
    assert ext.payload_nbytes([Blob(10), (Blob(5), {"k": b"xy"})]) == 17


def test_hooks_are_inherited_and_the_nearest_class_wins() -> None:
    assert ext.payload_nbytes(SubBlob(7)) == 7
    try:
        ext.register_nbytes(SubBlob, lambda blob: 2 * blob.size)
        assert ext.payload_nbytes(SubBlob(7)) == 14
        assert ext.payload_nbytes(Blob(7)) == 7
    finally:
        ext.register_nbytes(SubBlob, lambda blob: blob.size)


def test_a_hook_wins_over_the_adapter_of_the_same_class() -> None:
    class Special(Sized):
        pass

    ext.register_shardable(Special, SIZED)
    assert ext.payload_nbytes(Special(3)) == 24
    ext.register_nbytes(Special, lambda obj: 1)
    assert ext.payload_nbytes(Special(3)) == 1


def test_a_sized_list_subclass_uses_its_hook_not_its_items() -> None:
    class Packed(list[bytes]):
        pass

    ext.register_nbytes(Packed, lambda obj: 1000)
    assert ext.payload_nbytes(Packed([b"a"])) == 1000
    assert ext.payload_nbytes([Packed([b"a"]), b"bc"]) == 1002


def test_cycles_stop_at_the_depth_bound() -> None:
    loop: list[Any] = [b"abc"]
    loop.append(loop)
    assert ext.payload_nbytes(loop, max_depth=3) == 9


def test_long_containers_are_scaled_from_their_first_items() -> None:
    from sc_dispatch._nbytes import MAX_ITEMS

    chunk = [b"x" * 4] * MAX_ITEMS
    assert ext.payload_nbytes(chunk) == 4 * MAX_ITEMS
    assert ext.payload_nbytes(chunk * 3) == 12 * MAX_ITEMS
    assert ext.payload_nbytes(dict(enumerate(chunk * 2))) == 8 * MAX_ITEMS


@pytest.mark.parametrize("bad", [-1, 2.5, True, None, "9"])
def test_a_hook_must_return_a_non_negative_int(bad: Any) -> None:
    class Broken:
        pass

    ext.register_nbytes(Broken, lambda obj: bad)
    with pytest.raises(scd.DispatchArgumentError, match=rf"nbytes of .*Broken returned {bad!r}"):
        ext.payload_nbytes([Broken()])


@pytest.mark.parametrize("depth", [-1, 1.0, True, None])
def test_max_depth_must_be_a_non_negative_int(depth: Any) -> None:
    with pytest.raises(scd.DispatchArgumentError, match=r"max_depth must be a non-negative int"):
        ext.payload_nbytes([b"a"], max_depth=depth)


def test_register_nbytes_checks_its_arguments() -> None:
    with pytest.raises(scd.NotShardableError, match=r"register_nbytes: expected a class"):
        ext.register_nbytes(Blob(1), len)  # type: ignore[arg-type]
    with pytest.raises(scd.NotShardableError, match=r"hook for Blob must be callable"):
        ext.register_nbytes(Blob, 5)  # type: ignore[arg-type]
