"""sc-ray benchmarks: ratios against plain Ray measured in the same run.

    uv run python integration/benchmarks/bench_ray.py --out integration/benchmarks/results/ray.json

Measures, on a local cluster started here:

* ``noop``: a no-op ``ONE_TO_ALL`` call on 8 workers vs ``ray.get([a.noop.remote() ...])``
  on 8 bare actors (median latency; target ratio <= 1.3);
* ``dp_proto``: ``DP_COMPUTE_PROTO`` of a DataProto to 4 workers returning the same size, vs
  plain Ray with numpy shards (target >= 0.7x its throughput) and vs the same trip with
  ``torch.save`` / ``torch.load`` serialization (target >= 5x);
* ``chain``: two chained non-blocking calls; bytes the driver fetched (target < 1 MiB);
* ``startup``: 8 workers importing torch vs 8 bare actors importing torch (target <= 1.3).

``--mib`` sets the DataProto size (default 512), ``--chain-mib`` the chain's (default 256).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import numpy as np
import ray
import torch
from sc_core import SpanRecorder, Worker
from sc_dispatch import Dispatch, register
from sc_protocol import DataProto
from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from sc_ray import _ray_api as rapi


class NoopWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None


@ray.remote(num_cpus=0.1)
class BareNoop:
    def noop(self) -> None:
        return None


class ProtoWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def produce(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def consume(self, data: DataProto) -> DataProto:
        return data


@ray.remote(num_cpus=0.1)
class BareArray:
    def echo(self, x: np.ndarray) -> np.ndarray:
        return x

    def echo_torch_save(self, blob: bytes) -> bytes:
        tensor = torch.load(io.BytesIO(blob))
        out = io.BytesIO()
        torch.save(tensor, out)
        return out.getvalue()


class TorchWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        import torch as _torch

        self.version = _torch.__version__

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


@ray.remote(num_cpus=0.1)
class BareTorch:
    def __init__(self) -> None:
        import torch as _torch

        self.version = _torch.__version__

    def ping(self) -> int:
        return 0


def _median_time(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_noop(repeat: int) -> dict[str, float]:
    bare = [BareNoop.remote() for _ in range(8)]
    ray.get([a.noop.remote() for a in bare])
    with RayWorkerGroup(
        RayResourcePool([8], use_gpu=False), RayClassWithInitArgs(NoopWorker)
    ) as wg:
        for _ in range(20):
            wg.noop()
            ray.get([a.noop.remote() for a in bare])
        raw = _median_time(lambda: ray.get([a.noop.remote() for a in bare]), repeat)
        ours = _median_time(wg.noop, repeat)
    for a in bare:
        ray.kill(a)
    return {"raw_ray_s": raw, "sc_ray_s": ours, "ratio": ours / raw, "target_max": 1.3}


def bench_dp_proto(mib: int, repeat: int) -> dict[str, float]:
    width = 32768  # float32 columns: 128 KiB per row
    rows = max(4, mib * 1024 * 1024 // (width * 4))
    rows -= rows % 4
    tensor = torch.rand(rows, width)
    nbytes = tensor.numel() * 4
    data = DataProto.from_dict({"x": tensor})
    array = tensor.numpy()
    bare = [BareArray.remote() for _ in range(4)]
    ray.get([a.echo.remote(np.zeros(1)) for a in bare])

    def raw_numpy() -> None:
        shards = np.array_split(array, 4)
        refs = [a.echo.remote(ray.put(s)) for a, s in zip(bare, shards, strict=True)]
        out = np.concatenate(ray.get(refs))
        if out.shape != array.shape:
            raise RuntimeError("raw numpy trip lost rows")

    def torch_save() -> None:
        blobs = []
        for shard in torch.chunk(tensor, 4):
            buf = io.BytesIO()
            torch.save(shard.clone(), buf)
            blobs.append(buf.getvalue())
        refs = [a.echo_torch_save.remote(b) for a, b in zip(bare, blobs, strict=True)]
        out = torch.cat([torch.load(io.BytesIO(b)) for b in ray.get(refs)])
        if out.shape != tensor.shape:
            raise RuntimeError("torch.save trip lost rows")

    with RayWorkerGroup(
        RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(ProtoWorker)
    ) as wg:
        wg.echo(DataProto.from_dict({"x": torch.zeros(4, 2)}))

        def ours() -> None:
            out = wg.echo(data)
            if len(out) != rows:
                raise RuntimeError("sc-ray trip lost rows")

        ours()
        raw_numpy()
        torch_save()
        t_raw = _median_time(raw_numpy, repeat)
        t_ours = _median_time(ours, repeat)
        t_save = _median_time(torch_save, max(1, repeat - 1))
    for a in bare:
        ray.kill(a)
    gib = nbytes / 2**30
    return {
        "mib": nbytes / 2**20,
        "raw_numpy_gib_s": gib / t_raw,
        "sc_ray_gib_s": gib / t_ours,
        "torch_save_gib_s": gib / t_save,
        "ratio_vs_raw_numpy": t_raw / t_ours,
        "ratio_vs_torch_save": t_save / t_ours,
        "target_min_vs_raw_numpy": 0.7,
        "target_min_vs_torch_save": 5.0,
    }


def bench_chain(mib: int) -> dict[str, float]:
    width = 32768
    rows = max(6, mib * 1024 * 1024 // (width * 4))
    data = DataProto.from_dict({"x": torch.rand(rows, width)})
    with (
        RayWorkerGroup(
            RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(ProtoWorker)
        ) as producer,
        RayWorkerGroup(
            RayResourcePool([3], use_gpu=False), RayClassWithInitArgs(ProtoWorker)
        ) as consumer,
    ):
        with SpanRecorder() as rec:
            first = producer.produce(data)
            second = consumer.consume(first)
            rows_out = len(second)  # row counts only: a few bytes of metadata
        fetched = sum(s.bytes_fetched for s in rec.spans)
        put = sum(s.bytes_put for s in rec.spans)
        if rows_out != rows:
            raise RuntimeError("chain lost rows")
        del first, second
    return {
        "mib": rows * width * 4 / 2**20,
        "bytes_fetched_by_driver": float(fetched),
        "bytes_put_by_driver": float(put),
        "target_max_fetched_bytes": float(2**20),
    }


def bench_startup() -> dict[str, float]:
    start = time.perf_counter()
    bare = [BareTorch.remote() for _ in range(8)]
    ray.get([a.ping.remote() for a in bare])
    t_bare = time.perf_counter() - start
    for a in bare:
        ray.kill(a)
    time.sleep(2)
    start = time.perf_counter()
    with RayWorkerGroup(
        RayResourcePool([8], use_gpu=False), RayClassWithInitArgs(TorchWorker)
    ) as wg:
        wg.ping()
        t_ours = time.perf_counter() - start
    return {
        "bare_actors_s": t_bare,
        "sc_ray_s": t_ours,
        "ratio": t_ours / t_bare,
        "target_max": 1.3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("integration/benchmarks/results/ray.json"))
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--chain-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--noop-repeat", type=int, default=200)
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["noop", "dp_proto", "chain", "startup"]
    )
    args = parser.parse_args(argv)
    store = max(2 * 2**30, 5 * args.mib * 2**20)
    rapi.init_local(num_cpus=16, object_store_memory=store)
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "ray": ray.__version__,
            "torch": torch.__version__,
        }
    }
    try:
        if "startup" not in args.skip:
            results["startup"] = bench_startup()
            print("startup", results["startup"], flush=True)
        if "noop" not in args.skip:
            results["noop"] = bench_noop(args.noop_repeat)
            print("noop", results["noop"], flush=True)
        if "dp_proto" not in args.skip:
            results["dp_proto"] = bench_dp_proto(args.mib, args.repeat)
            print("dp_proto", results["dp_proto"], flush=True)
        if "chain" not in args.skip:
            results["chain"] = bench_chain(args.chain_mib)
            print("chain", results["chain"], flush=True)
    finally:
        rapi.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
