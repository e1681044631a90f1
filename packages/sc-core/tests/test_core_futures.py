"""LazyFuture: computed once, errors re-raised, lazy split/join/pad."""

from __future__ import annotations

import pytest
from _core_fakes import Batch
from sc_core import LazyFuture
from sc_dispatch import NotShardableError
from sc_dispatch.ext import get_shard_adapter, is_future, materialize


def test_value_is_computed_once_on_first_get() -> None:
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return 7

    fut = LazyFuture(compute, "seven")
    assert not fut.done()
    assert "pending" in repr(fut)
    assert calls == []
    assert fut.get() == 7
    assert fut.get() == 7
    assert calls == [1]
    assert fut.done()
    assert "seven done" in repr(fut)


def test_failure_is_re_raised_every_time() -> None:
    def boom() -> int:
        raise KeyError("k")

    fut = LazyFuture(boom)
    for _ in range(2):
        with pytest.raises(KeyError):
            fut.get()


def test_completed_and_registered_as_future() -> None:
    fut = LazyFuture.completed([1, 2])
    assert fut.done()
    assert is_future(fut)
    args, kwargs = materialize((fut,), {"k": fut})
    assert args == ([1, 2],)
    assert kwargs == {"k": [1, 2]}


def test_adapter_is_lazy_and_matches_the_value_adapter() -> None:
    computed: list[int] = []

    def value() -> Batch:
        computed.append(1)
        return Batch(range(5))

    fut = LazyFuture(value)
    adapter = get_shard_adapter(fut)
    assert adapter is not None
    parts = adapter.chunk(fut, 2)
    joined = adapter.concat(parts)
    padded = adapter.pad(joined, 1)
    unpadded = adapter.unpad(padded, 1)
    assert computed == []
    assert unpadded.get() == Batch(range(5))
    assert padded.get() == Batch([0, 1, 2, 3, 4, 0])
    assert [p.get() for p in parts] == [Batch([0, 1, 2]), Batch([3, 4])]
    assert computed == [1]
    assert adapter.length(fut) == 5
    assert adapter.auto_padding(fut) is True


def test_adapter_on_a_value_that_cannot_be_split() -> None:
    fut = LazyFuture.completed(object())
    adapter = get_shard_adapter(fut)
    assert adapter is not None
    with pytest.raises(NotShardableError, match=r"LazyFuture.length"):
        adapter.length(fut)
    with pytest.raises(NotShardableError, match=r"LazyFuture.chunk"):
        adapter.chunk(fut, 2)[0].get()
    with pytest.raises(NotShardableError, match=r"LazyFuture.pad"):
        adapter.pad(fut, 1).get()
    with pytest.raises(NotShardableError, match=r"LazyFuture.auto_padding"):
        adapter.auto_padding(fut)
