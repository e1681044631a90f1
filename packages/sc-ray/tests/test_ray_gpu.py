"""sc-ray on a GPU machine (the ``gpu`` nox session; skipped without a GPU): each worker of
a ``use_gpu`` pool sees its own GPU, and DataProtos of CUDA tensors travel from the driver to
the workers and back (blocking, and chained as futures) and arrive on a CUDA device."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from sc_core import Worker
from sc_dispatch import Dispatch, register
from sc_protocol import DataProto
from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

RAY_INIT: dict[str, Any] = {"num_cpus": 4}

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available())"
    ),
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("no_leaks"),
]


class CudaWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self) -> dict[str, Any]:
        return {
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "count": torch.cuda.device_count(),
            "name": torch.cuda.get_device_name(0),
        }

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        assert data.batch is not None
        x = data.batch["x"]
        if x.device.type != "cuda":
            raise TypeError(f"rank {self.rank}: x arrived on {x.device}")
        return DataProto.from_dict({"y": x * 2, "device": torch.full_like(x, x.device.index)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def produce(self, data: DataProto) -> DataProto:
        assert data.batch is not None
        return DataProto.from_dict({"x": data.batch["x"].cuda() + 1})


def _group() -> RayWorkerGroup:
    pool = RayResourcePool([torch.cuda.device_count()], use_gpu=True)
    return RayWorkerGroup(pool, RayClassWithInitArgs(CudaWorker))


def _batch(rows: int) -> DataProto:
    x = torch.arange(rows * 4, dtype=torch.float32, device="cuda").reshape(rows, 4)
    return DataProto.from_dict({"x": x})


def test_each_worker_sees_one_gpu(ray_cluster: None) -> None:
    with _group() as wg:
        seen = wg.where()
    assert len(seen) == torch.cuda.device_count()
    assert all(s["count"] == 1 for s in seen)
    assert len({s["visible"] for s in seen}) == len(seen)


def test_cuda_dataproto_round_trip(ray_cluster: None) -> None:
    rows = 4 * torch.cuda.device_count()
    data = _batch(rows)
    with _group() as wg:
        out = wg.double(data)
    assert out.batch is not None
    assert out.batch["y"].device.type == "cuda"
    assert torch.equal(out.batch["y"], data.batch["x"] * 2)  # type: ignore[index]
    assert set(out.batch["device"].flatten().tolist()) == {0.0}  # each worker's own cuda:0


def test_cuda_futures_chain(ray_cluster: None) -> None:
    rows = 4 * torch.cuda.device_count()
    with _group() as wg:
        future = wg.produce(_batch(rows).to("cpu"))
        out = wg.double(future)
    assert out.batch is not None
    expected = (torch.arange(rows * 4, dtype=torch.float32).reshape(rows, 4) + 1) * 2
    assert torch.equal(out.batch["y"].cpu(), expected)
