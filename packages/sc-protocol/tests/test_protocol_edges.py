"""Edges found by probing (issue 12): bytes that must not travel or be stored, silent
misbehaviour turned into typed errors, files left by crashed saves, the safe-load default."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from _protocol_helpers import make_dp, row_ids
from sc_protocol import (
    DataProto,
    IndexOutOfRangeError,
    InvalidSizeError,
    KeyConflictError,
    KeyMismatchError,
    ScProtocolError,
    SerializationError,
    union_tensor_dict,
)
from tensordict import TensorDict

ROWS, WIDTH = 2000, 1000  # 8 MB of float32


def _big() -> DataProto:
    return DataProto.from_dict({"x": torch.ones(ROWS, WIDTH)}, non_tensors={"u": np.arange(ROWS)})


# --- bytes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("make_view", [lambda d: d[:10], lambda d: d.chunk(200)[1]])
def test_saving_a_view_writes_only_its_rows(tmp_path: Path, make_view: object) -> None:
    view = make_view(_big())  # type: ignore[operator]
    path = tmp_path / "view.pt"
    view.save_to_disk(path)
    row_bytes = WIDTH * 4 + 8
    assert path.stat().st_size < 10 * row_bytes + 64 * 1024  # not the 8 MB storage
    back = DataProto.load_from_disk(path)
    assert back.batch is not None
    assert back.batch["x"].untyped_storage().nbytes() == 10 * WIDTH * 4
    assert back.batch["x"].shape == (10, WIDTH)


def test_pickling_one_row_carries_only_that_row() -> None:
    item = _big()[3]
    blob = pickle.dumps(item, protocol=5)
    assert len(blob) < 2 * WIDTH * 4  # one row, not 8 MB
    back = pickle.loads(blob)
    assert torch.equal(back.batch["x"], torch.ones(WIDTH))
    assert back.non_tensor_batch["u"] == 3


def test_pickled_chunks_carry_only_their_rows() -> None:
    part = _big().chunk(4)[2]
    assert len(pickle.dumps(part, protocol=5)) < (ROWS // 4) * (WIDTH * 4 + 8) + 64 * 1024


# --- indices, reorder, concat, slicing, repeat -----------------------------------------------


@pytest.mark.parametrize(
    "index",
    [[2**64 - 1], np.array([2**64 - 1], dtype=np.uint64), [2**70], np.array([6], np.uint8)],
)
def test_indices_that_would_wrap_are_out_of_range(index: object) -> None:
    with pytest.raises(IndexOutOfRangeError, match=r"out of range for a batch of 6 rows"):
        make_dp(6).select_idxs(index)  # type: ignore[arg-type]


def test_unsigned_indices_in_range_still_work() -> None:
    assert row_ids(make_dp(6).select_idxs(np.array([5, 0], dtype=np.uint64))) == [5, 0]


def test_reorder_requires_a_permutation() -> None:
    dp = make_dp(6)
    with pytest.raises(InvalidSizeError, match=r"permutation of the 6 rows.*got 2 indices"):
        dp.reorder([0, 1])
    with pytest.raises(InvalidSizeError, match=r"permutation"):
        dp.reorder([0, 0, 1, 2, 3, 4])
    assert len(dp) == 6  # unchanged
    dp.reorder([5, 4, 3, 2, 1, 0])
    assert row_ids(dp) == [5, 4, 3, 2, 1, 0]


def test_concat_refuses_to_promote_dtypes() -> None:
    a = DataProto.from_dict({"x": torch.zeros(2, dtype=torch.float32)})
    b = DataProto.from_dict({"x": torch.tensor([2**40 + 1, 1], dtype=torch.int64)})
    with pytest.raises(KeyMismatchError, match=r"'x' is torch.float32 in part 0 and torch.int64"):
        DataProto.concat([a, b])
    c = DataProto.from_dict(non_tensors={"n": np.array([1, 2])})
    d = DataProto.from_dict(non_tensors={"n": ["a", "b"]})
    with pytest.raises(KeyMismatchError, match=r"column 'n' is int64 in part 0 and object"):
        DataProto.concat([c, d])
    # strings of different lengths only widen: allowed
    e = DataProto.from_dict(non_tensors={"s": np.array(["a"])})
    f = DataProto.from_dict(non_tensors={"s": np.array(["longer"])})
    assert list(DataProto.concat([e, f]).non_tensor_batch["s"]) == ["a", "longer"]


def test_concat_of_rows_with_different_shapes_is_typed() -> None:
    a = DataProto.from_dict({"x": torch.zeros(2, 3)})
    b = DataProto.from_dict({"x": torch.zeros(2, 5)})
    with pytest.raises(KeyMismatchError, match=r"rows of shape \(3,\) in part 0 and \(5,\)"):
        DataProto.concat([a, b])


def test_negative_step_slices_select_rows_in_that_order() -> None:
    dp = make_dp(5)
    assert row_ids(dp[::-1]) == [4, 3, 2, 1, 0]
    assert row_ids(dp[::-2]) == [4, 2, 0]
    assert list(dp[3:0:-1].non_tensor_batch["uid"]) == ["u3", "u2", "u1"]


def test_repeat_beyond_memory_is_typed() -> None:
    with pytest.raises(InvalidSizeError, match=r"repeat_times 1099511627776"):
        make_dp(2).repeat(2**40)


def test_union_of_different_dtypes_names_them() -> None:
    left = TensorDict({"v": torch.tensor([1, 2, 3])}, batch_size=[3])
    right = TensorDict({"v": torch.tensor([1.0, 2.0, 3.0])}, batch_size=[3])
    with pytest.raises(KeyConflictError, match=r"dtypes torch.int64 and torch.float32"):
        union_tensor_dict(left, right)


# --- meta_info that cannot be pickled ---------------------------------------------------------


def test_unpicklable_meta_info_names_its_key(tmp_path: Path) -> None:
    dp = make_dp(2, meta={"fine": {"lr": 0.1}, "lock": threading.Lock()})
    with pytest.raises(SerializationError, match=r"meta_info\['lock'\] \(a lock\) cannot be"):
        pickle.dumps(dp)
    with pytest.raises(SerializationError, match=r"meta_info\['lock'\]"):
        dp.save_to_disk(tmp_path / "x.pt")
    with pytest.raises(SerializationError, match=r"meta_info\['lock'\]"):
        pickle.dumps(dp[0])
    assert not list(tmp_path.iterdir())


# --- files ------------------------------------------------------------------------------------


def test_saved_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        make_dp(2).save_to_disk(tmp_path / "a.pt")
    finally:
        os.umask(old)
    assert (tmp_path / "a.pt").stat().st_mode & 0o777 == 0o644


@pytest.mark.slow  # a child process is killed mid-save
def test_a_killed_save_leaves_a_temporary_that_the_next_save_removes(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, signal, torch
        from sc_protocol import DataProto

        real_save = torch.save

        def save_then_die(obj, f, *args, **kwargs):
            real_save(obj, f, *args, **kwargs)
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # after writing, before the rename

        torch.save = save_then_die
        DataProto.from_dict({{"x": torch.ones(1000, 100)}}).save_to_disk({str(tmp_path / "b.pt")!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert len(leftovers) == 1
    assert leftovers[0].startswith(".sc-protocol-")
    assert leftovers[0].endswith(".tmp")
    assert not (tmp_path / "b.pt").exists()
    make_dp(2).save_to_disk(tmp_path / "c.pt")  # a later save into the same directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_temporaries_of_live_processes_and_other_names_are_kept(tmp_path: Path) -> None:
    from sc_protocol._atomic_file import _HOST

    mine = tmp_path / f".sc-protocol-{_HOST}-{os.getpid()}-abc123.tmp"
    other = tmp_path / ".user-file.tmp"
    mine.write_bytes(b"in progress")
    other.write_bytes(b"not ours")
    make_dp(2).save_to_disk(tmp_path / "d.pt")
    assert mine.exists()
    assert other.exists()


def test_errors_raised_here_are_protocol_errors() -> None:
    assert issubclass(KeyMismatchError, ScProtocolError)
