"""DataProto with CUDA tensors (the ``gpu`` nox session; skipped without a GPU): pickling
(the bytes go through the CPU, the tensors come back on their device), row operations that
index on the device, chunk / concat round trips, and moving between devices."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from sc_protocol import DataProto

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available())"
    ),
]


def _cuda_batch(rows: int = 6) -> DataProto:
    return DataProto.from_dict(
        tensors={
            "x": torch.arange(rows * 3, dtype=torch.float32, device="cuda").reshape(rows, 3),
            "mask": torch.ones(rows, 2, dtype=torch.bool, device="cuda"),
            "half": torch.randn(rows, 4, device="cuda").to(torch.bfloat16),
        },
        non_tensors={"uid": np.array([f"u{i}" for i in range(rows)], dtype=object)},
        meta_info={"step": 3},
    )


def _same(a: DataProto, b: DataProto) -> None:
    assert a.batch is not None
    assert b.batch is not None
    assert sorted(a.batch.keys()) == sorted(b.batch.keys())
    for key in a.batch:
        left, right = a.batch[key], b.batch[key]
        assert left.device == right.device, key
        assert torch.equal(left, right), key
    assert list(a.non_tensor_batch["uid"]) == list(b.non_tensor_batch["uid"])
    assert a.meta_info == b.meta_info


@pytest.mark.parametrize("protocol", [4, 5])
def test_pickle_keeps_the_device(protocol: int) -> None:
    data = _cuda_batch()
    back = pickle.loads(pickle.dumps(data, protocol=protocol))
    _same(back, data)
    assert back.batch is not None
    assert back.batch["x"].device.type == "cuda"


def test_zero_copy_pickle_of_cuda_tensors() -> None:
    data = _cuda_batch()
    buffers: list[pickle.PickleBuffer] = []
    blob = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    assert buffers  # the tensor bytes travel out of band, copied once to the CPU
    _same(pickle.loads(blob, buffers=buffers), data)


def test_row_ops_index_on_the_device() -> None:
    data = _cuda_batch()
    picked = data.select_idxs(torch.tensor([4, 1]))
    assert picked.batch is not None
    assert picked.batch["x"].device.type == "cuda"
    assert picked.batch["x"][:, 0].tolist() == [12.0, 3.0]
    assert list(picked.non_tensor_batch["uid"]) == ["u4", "u1"]
    repeated = data.repeat(2, interleave=True)
    assert len(repeated) == 12
    assert repeated.batch is not None
    assert repeated.batch["x"].device.type == "cuda"


def test_chunk_concat_round_trip_on_cuda() -> None:
    data = _cuda_batch(8)
    parts = data.chunk(4)
    assert all(p.batch is not None and p.batch["x"].device.type == "cuda" for p in parts)
    _same(DataProto.concat(parts), data)


def test_to_cpu_and_back() -> None:
    data = _cuda_batch()
    on_cpu = data.to("cpu")
    assert on_cpu.batch is not None
    assert on_cpu.batch["x"].device.type == "cpu"
    _same(on_cpu.to("cuda:0"), data)
