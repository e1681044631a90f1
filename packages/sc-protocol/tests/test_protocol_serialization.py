"""Zero-copy pickling and atomic save / load."""

from __future__ import annotations

import gc
import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _protocol_helpers import assert_dp_equal, make_dp
from sc_protocol import DataProto, DataProtoConfig, SerializationError
from sc_protocol._serialize import rebuild_tensor, tensor_state
from tensordict import TensorDict


def oob_roundtrip(obj: Any) -> tuple[Any, bytes, list[pickle.PickleBuffer]]:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=buffers), data, buffers


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_roundtrip_every_protocol(protocol: int) -> None:
    dp = make_dp(5, meta={"step": 1, "cfg": {"lr": 0.1}})
    out = pickle.loads(pickle.dumps(dp, protocol=protocol))
    assert_dp_equal(out, dp)
    assert out.meta_info == {"step": 1, "cfg": {"lr": 0.1}}


def test_out_of_band_keeps_tensor_data_out_of_the_stream() -> None:
    big = torch.arange(4096, dtype=torch.int64).reshape(1024, 4) * 1234567
    dp = DataProto.from_dict({"x": big, "h": big.to(torch.bfloat16)}, {"u": np.arange(1024)})
    out, data, buffers = oob_roundtrip(dp)
    assert_dp_equal(out, dp)
    assert len(data) < 4096  # 40 KiB of tensors, a few hundred bytes of pickle
    assert big.numpy().tobytes()[:64] not in data
    assert sum(memoryview(b).nbytes for b in buffers) >= big.numel() * 8 + big.numel() * 2
    # The buffers alias the sender's memory: nothing was copied.
    assert out.batch is not None
    assert out.batch["x"].data_ptr() == big.data_ptr()


def test_in_band_protocol_5_copies_once_and_is_writable() -> None:
    dp = make_dp(4)
    out = pickle.loads(pickle.dumps(dp, protocol=5))
    assert out.batch is not None
    assert dp.batch is not None
    assert out.batch["ids"].data_ptr() != dp.batch["ids"].data_ptr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out.batch["ids"][0, 0] = 42
    assert int(dp.batch["ids"][0, 0]) == 0


def test_view_of_a_large_storage_sends_only_its_rows() -> None:
    base = torch.zeros(10_000, 8)
    dp = DataProto.from_dict({"x": base[:10]})
    _, _, buffers = oob_roundtrip(dp)
    assert sum(memoryview(b).nbytes for b in buffers) == 10 * 8 * 4


def test_non_contiguous_tensor_is_made_contiguous() -> None:
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, ::2]
    dp = DataProto.from_dict({"x": t})
    out, _, _ = oob_roundtrip(dp)
    assert out.batch is not None
    assert torch.equal(out.batch["x"], t)
    assert out.batch["x"].is_contiguous()


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bool,
        torch.bfloat16,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.int64,
        torch.uint8,
        torch.complex64,
    ],
)
def test_every_dtype_roundtrips(dtype: torch.dtype) -> None:
    t = (torch.arange(12).reshape(3, 4) % 5).to(dtype)
    for protocol in (4, 5):
        state = tensor_state(t, protocol)
        out = rebuild_tensor(state)
        assert out.dtype == dtype
        assert torch.equal(out, t)


def test_zero_dim_empty_and_requires_grad_tensors() -> None:
    for t in (torch.tensor(3.5), torch.zeros(0, 3), torch.ones(2, requires_grad=True)):
        out = rebuild_tensor(pickle.loads(pickle.dumps(tensor_state(t, 5), protocol=5)))
        assert out.shape == t.shape
        assert out.requires_grad == t.requires_grad
        assert torch.equal(out.detach(), t.detach())


def test_conjugate_view_is_resolved() -> None:
    t = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj()
    out = rebuild_tensor(tensor_state(t, 5))
    assert torch.equal(out, t.resolve_conj())


def test_sparse_tensor_falls_back_to_torch_pickling() -> None:
    t = torch.eye(3).to_sparse()
    out = rebuild_tensor(pickle.loads(pickle.dumps(tensor_state(t, 5), protocol=5)))
    assert torch.equal(out.to_dense(), torch.eye(3))


def test_read_only_buffers_alias_without_warning() -> None:
    dp = make_dp(3)
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
    readonly = [memoryview(bytes(memoryview(b))) for b in buffers]
    assert all(v.readonly for v in readonly)
    addresses = {int(np.frombuffer(v, dtype=np.uint8).ctypes.data) for v in readonly}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = pickle.loads(data, buffers=readonly)
    del readonly, buffers
    gc.collect()
    assert_dp_equal(out, dp)  # the tensors keep the received buffers alive
    assert out.batch is not None
    assert {t.data_ptr() for t in out.batch.values()} <= addresses  # no copy


def test_read_only_buffers_copied_when_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SC_PROTOCOL_COPY_READONLY_BUFFERS", "1")
    assert DataProtoConfig.copy_readonly_buffers is True
    dp = make_dp(3)
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
    raw = [bytes(memoryview(b)) for b in buffers]
    out = pickle.loads(data, buffers=[memoryview(r) for r in raw])
    assert out.batch is not None
    out.batch["ids"][0, 0] = 77  # a private, writable copy
    assert_dp_equal(pickle.loads(data, buffers=[memoryview(r) for r in raw]), dp)


def test_batch_size_device_and_nested_survive() -> None:
    td = TensorDict(
        {
            "a": torch.arange(6).reshape(3, 2),
            "n": TensorDict({"b": torch.ones(3, 4)}, batch_size=[3, 4]),
        },
        batch_size=[3],
        device="cpu",
    )
    td.names = ["rows"]
    dp = DataProto(batch=td, non_tensor_batch={"u": np.array(["x", "y", "z"], dtype=object)})
    out, _, _ = oob_roundtrip(dp)
    assert out.batch.device == torch.device("cpu")
    assert out.batch["n"].batch_size == torch.Size([3, 4])
    assert out.batch.names == ["rows"]
    assert torch.equal(out.batch["n", "b"], torch.ones(3, 4))


def test_jagged_nested_tensor_roundtrips() -> None:
    nt = torch.nested.nested_tensor(
        [torch.ones(2), torch.arange(3.0), torch.zeros(1)], layout=torch.jagged
    )
    dp = DataProto(batch=TensorDict({"j": nt, "x": torch.arange(3)}, batch_size=[3]))
    out, _, _ = oob_roundtrip(dp)
    got = out.batch["j"]
    assert got.is_nested
    assert [t.tolist() for t in got.unbind()] == [[1.0, 1.0], [0.0, 1.0, 2.0], [0.0]]


def test_empty_and_non_tensor_only_batches_roundtrip() -> None:
    for dp in (DataProto(), make_dp(3, tensors=False), make_dp(0), DataProto(meta_info={"k": 1})):
        for protocol in (4, 5):
            out = pickle.loads(pickle.dumps(dp, protocol=protocol))
            assert_dp_equal(out, dp)
            assert out.meta_info == dp.meta_info


class MyProto(DataProto):
    """A user subclass; pickling must keep the class."""


def test_subclass_is_preserved() -> None:
    dp = MyProto.from_dict({"x": torch.ones(2)})
    out = pickle.loads(pickle.dumps(dp, protocol=5))
    assert type(out) is MyProto


def test_unknown_state_raises() -> None:
    with pytest.raises(SerializationError, match=r"unknown kind 'weird'"):
        rebuild_tensor(("weird",))
    with pytest.raises(SerializationError, match=r"unknown dtype 'nonsense'"):
        rebuild_tensor(("raw", b"\x00", "nonsense", (1,), "cpu", False))


# --- save / load -------------------------------------------------------------------------


def test_save_load_roundtrip_weights_only(tmp_path: Path) -> None:
    dp = make_dp(4, meta={"step": 2, "name": "ppo", "lrs": [0.1, 0.2]})
    dp.non_tensor_batch["text"] = np.array(["a", "bb", "ccc", "d"])
    dp.non_tensor_batch["grid"] = np.arange(8, dtype=np.int32).reshape(4, 2)
    dp.non_tensor_batch["lists"] = np.empty(4, dtype=object)
    for i in range(4):
        dp.non_tensor_batch["lists"][i] = list(range(i))
    path = tmp_path / "batch.pt"
    dp.save_to_disk(path)
    out = DataProto.load_from_disk(path, weights_only=True)
    assert_dp_equal(out, dp)
    assert out.meta_info == dp.meta_info
    assert out.non_tensor_batch["text"].dtype == np.dtype("<U3")
    assert out.non_tensor_batch["lists"][3] == [0, 1, 2]
    assert os.listdir(tmp_path) == ["batch.pt"]


def test_save_load_arbitrary_objects_needs_full_unpickling(tmp_path: Path) -> None:
    dp = make_dp(2)
    dp.non_tensor_batch["arr"] = np.empty(2, dtype=object)
    dp.non_tensor_batch["arr"][0] = np.arange(3)
    dp.non_tensor_batch["arr"][1] = np.arange(2)
    path = tmp_path / "b.pt"
    dp.save_to_disk(str(path))
    # The default is the safe load: a file that needs full unpickling is refused, and the
    # message says why it is unsafe and how to opt in.
    for kwargs in ({}, {"weights_only": True}):
        with pytest.raises(SerializationError, match=r"safe loading refuses") as info:
            DataProto.load_from_disk(path, **kwargs)
        assert "weights_only=False only for a file you trust" in str(info.value)
        assert "\x1b[" not in str(info.value)  # no terminal colour codes from torch
    out = DataProto.load_from_disk(path, weights_only=False)
    assert out.non_tensor_batch["arr"][0].tolist() == [0, 1, 2]


def test_save_is_atomic_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "b.pt"
    make_dp(2).save_to_disk(path)
    before = path.read_bytes()

    def boom(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        make_dp(3).save_to_disk(path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["b.pt"]


def test_load_rejects_foreign_files(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"a": torch.ones(1)}, path)
    with pytest.raises(SerializationError, match=r"is not a file written by save_to_disk"):
        DataProto.load_from_disk(path)
    torch.save({"format": "sc_protocol.DataProto", "version": 99}, path)
    with pytest.raises(SerializationError, match=r"format version 99"):
        DataProto.load_from_disk(path)


def test_empty_batches_save_and_load(tmp_path: Path) -> None:
    for i, dp in enumerate((DataProto(), make_dp(3, tensors=False), make_dp(0))):
        path = tmp_path / f"{i}.pt"
        dp.save_to_disk(path)
        assert_dp_equal(DataProto.load_from_disk(path, weights_only=True), dp)


def test_torch_save_of_a_dataproto_still_works() -> None:
    dp = make_dp(2)
    buf = io.BytesIO()
    torch.save(dp, buf)
    buf.seek(0)
    assert_dp_equal(torch.load(buf, weights_only=False), dp)


def test_copy_is_shallow_and_deepcopy_is_deep() -> None:
    import copy

    dp = make_dp(3, meta={"cfg": {"a": 1}})
    shallow = copy.copy(dp)
    assert shallow.batch is dp.batch
    assert shallow.non_tensor_batch["uid"] is dp.non_tensor_batch["uid"]
    assert shallow.meta_info is not dp.meta_info
    assert shallow.meta_info["cfg"] is dp.meta_info["cfg"]
    deep = copy.deepcopy(dp)
    assert_dp_equal(deep, dp)
    assert deep.batch is not None
    assert dp.batch is not None
    deep.batch["ids"][0, 0] = -5
    assert int(dp.batch["ids"][0, 0]) == 0
    deep.meta_info["cfg"]["a"] = 2
    assert dp.meta_info["cfg"] == {"a": 1}
    assert copy.deepcopy(DataProto()).batch is None
