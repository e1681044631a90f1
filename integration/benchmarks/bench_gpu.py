"""GPU benchmark (run by ``integration/gpu-check.sh`` and the ``gpu`` nox session): sc-ray
against raw Ray on workers that hold one GPU each.

* ``noop``: a no-op ``ONE_TO_ALL`` call vs ``ray.get(a.noop.remote())`` on bare GPU actors
  (median latency, the two taking turns);
* ``cuda_data``: a ``DP_COMPUTE_PROTO`` echo of a DataProto of CUDA tensors (driver → worker
  → driver, arriving on the GPU at both ends) vs raw Ray passing the same CUDA tensor to a
  bare GPU actor and back (Ray pickles it with torch's own reducer), per size;
* ``weight_sync``: recorded as not measured until weight sync exists (issue 15).

    uv run python integration/benchmarks/bench_gpu.py --out integration/benchmarks/results/gpu.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, cast

import ray
import torch
from _machine import median_times, stamp, write_result  # this folder: the script's own
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from sc_core import Worker
from sc_dispatch import Dispatch, register
from sc_protocol import DataProto
from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

WIDTH = 32768  # float32 columns: 128 KiB per row


class GpuWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data


@ray.remote
class BareGpu:
    def noop(self) -> None:
        return None

    def echo(self, x: torch.Tensor) -> torch.Tensor:
        return x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("integration/benchmarks/results/gpu.json"))
    parser.add_argument("--sizes-mib", default="16,256", help="CUDA DataProto sizes (MiB)")
    parser.add_argument("--noop-repeat", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=10, help="data round trips per size")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device is visible; nothing measured", file=sys.stderr)
        return 1
    sizes = [float(s) for s in args.sizes_mib.split(",")]
    results: dict[str, Any] = {
        **stamp(
            "gpu",
            device=torch.cuda.get_device_name(0),
            gpus=torch.cuda.device_count(),
            torch=torch.__version__,
            cuda=torch.version.cuda,
            ray=ray.__version__,
        ),
        "weight_sync": "not measured: weight sync between meshes does not exist yet (issue 15)",
    }
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        # One GPU serves both sides: the bare actor takes half of the bundle that the
        # pool reserved, the sc-ray worker the other half (as colocated groups do).
        pool = RayResourcePool([1], use_gpu=True, num_cpus_per_process=0.2, max_colocate_count=2)
        with RayWorkerGroup(pool, RayClassWithInitArgs(GpuWorker)) as wg:
            strategy = PlacementGroupSchedulingStrategy(
                cast(Any, pool.get_placement_groups()[0]), placement_group_bundle_index=0
            )
            bare = BareGpu.options(  # type: ignore[attr-defined]  # ray.remote's class
                num_gpus=0.5, num_cpus=0.1, scheduling_strategy=strategy
            ).remote()
            ray.get(bare.noop.remote())
            fns = {"raw": lambda: ray.get(bare.noop.remote()), "ours": wg.noop}
            median_times(fns, 20)
            t = median_times(fns, args.noop_repeat)
            results["noop"] = {"raw_ray_s": t["raw"], "sc_ray_s": t["ours"]}
            results["noop"]["ratio"] = t["ours"] / t["raw"]
            print(f"noop: {results['noop']}", flush=True)
            rows_out = []
            for mib in sizes:
                rows = max(1, int(mib * 2**20) // (WIDTH * 4))
                x = torch.randn(rows, WIDTH, device="cuda")
                data = DataProto.from_dict({"x": x})

                def raw(x: torch.Tensor = x) -> None:
                    back = ray.get(bare.echo.remote(x))
                    if back.device.type != "cuda":
                        raise RuntimeError(f"raw Ray returned the tensor on {back.device}")

                def ours(data: DataProto = data) -> None:
                    out = wg.echo(data)
                    if out.batch is None or out.batch["x"].device.type != "cuda":
                        raise RuntimeError("sc-ray returned the batch off the GPU")

                median_times({"raw": raw, "ours": ours}, 2)
                t = median_times({"raw": raw, "ours": ours}, args.repeat)
                row = {
                    "mib": mib,
                    "raw_ray_s": t["raw"],
                    "sc_ray_s": t["ours"],
                    "ratio": t["ours"] / t["raw"],
                    "sc_ray_gib_s": mib / 1024 / t["ours"],
                }
                print(f"cuda_data {mib} MiB: {row}", flush=True)
                rows_out.append(row)
            results["cuda_data"] = rows_out
            ray.kill(bare)
    finally:
        ray.shutdown()
    write_result(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
