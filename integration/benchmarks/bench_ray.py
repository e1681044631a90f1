"""sc-ray benchmarks: ratios against plain Ray measured in the same run.

    uv run python integration/benchmarks/bench_ray.py --out integration/benchmarks/results/ray.json
    uv run python integration/benchmarks/bench_ray.py --quick --out /tmp/ray.json   # smoke run

Measures, on one local cluster started here (8 logical CPUs), every baseline on bare Ray
actors of the same cluster:

* ``noop_sweep``: a no-op ``ONE_TO_ALL`` call on 1, 2, 4 and 8 workers (``--workers``) vs
  ``ray.get([a.noop.remote() ...])`` on as many bare actors (median latency; target ratio
  <= 1.3 on 8 workers, reported as ``noop``);
* ``dp_proto_sweep``: ``DP_COMPUTE_PROTO`` of a DataProto of 16, 64, 256 and 512 MiB
  (``--sizes-mib``) to 4 workers returning the same size, vs plain Ray with numpy shards
  (target >= 0.7x its throughput at 512 MiB) and vs the same trip with ``torch.save`` /
  ``torch.load`` serialization (target >= 5x); the largest size is reported as ``dp_proto``;
* ``dp_workers``: ``DP_COMPUTE_PROTO`` of 16 MiB (``--dp-workers-mib``) on 2, 4 and 8 workers
  (``--dp-workers``) vs plain Ray with numpy shards to as many bare actors (target <= 1.1x
  its time): the fixed per-rank cost of a small data call;
* ``chain``: two chained non-blocking calls over ``--chain-mib`` (256), from the 4 workers
  above to 3 others (a reshard); bytes the driver fetched and put, from the call spans
  (target: fetched < 1 MiB);
* ``startup``: 8 workers importing torch vs 8 bare actors importing torch, ``--startup-rounds``
  (2) of each in ABBA order, mean times (target <= 1.3). This worker never touches a
  DataProto: ``bench_startup.py`` measures a realistic one (sc-protocol, tensordict and a
  first ``DP_COMPUTE_PROTO`` call) against bare actors.

The candidates take turns within each repeat, in an order reversed every other repeat, so
that drift in the load of a shared machine hits them alike and neither always runs first.
``--quick`` is a smoke run with tiny sizes and few repeats (about a minute); its figures
mean nothing. ``integration/benchmarks/report.py`` prints the combined table and
draws the plot from the JSON files.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import numpy as np
import ray
import torch
from _machine import median_times, stamp, write_result  # this folder: the script's own
from sc_core import SpanRecorder, Worker
from sc_dispatch import Dispatch, register
from sc_protocol import DataProto
from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

CLUSTER_CPUS = 8
# Every actor, bare or sc-ray, asks for the same small CPU share, so that 8 workers and 8
# bare actors fit on the 8-CPU cluster together and neither side is scheduled differently.
ACTOR_CPUS = 0.1
WIDTH = 32768  # float32 columns: 128 KiB per row


class NoopWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None


@ray.remote(num_cpus=ACTOR_CPUS)
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


@ray.remote(num_cpus=ACTOR_CPUS)
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


@ray.remote(num_cpus=ACTOR_CPUS)
class BareTorch:
    def __init__(self) -> None:
        import torch as _torch

        self.version = _torch.__version__

    def ping(self) -> int:
        return 0


def _group(cls: type, n: int) -> RayWorkerGroup:
    pool = RayResourcePool([n], use_gpu=False, num_cpus_per_process=ACTOR_CPUS)
    return RayWorkerGroup(pool, RayClassWithInitArgs(cls))


def bench_noop(workers: list[int], repeat: int) -> list[dict[str, float]]:
    bare = [BareNoop.remote() for _ in range(max(workers))]
    ray.get([a.noop.remote() for a in bare])
    rows = []
    try:
        for n in workers:
            actors = bare[:n]

            def raw(actors: list[Any] = actors) -> None:
                ray.get([a.noop.remote() for a in actors])

            with _group(NoopWorker, n) as wg:
                median_times({"raw": raw, "ours": wg.noop}, 20)  # warm-up
                t = median_times({"raw": raw, "ours": wg.noop}, repeat)
            row = {
                "workers": float(n),
                "raw_ray_s": t["raw"],
                "sc_ray_s": t["ours"],
                "ratio": t["ours"] / t["raw"],
                "target_max": 1.3,
            }
            print(f"noop x{n}: {row}", flush=True)
            rows.append(row)
    finally:
        for a in bare:
            ray.kill(a)
    return rows


def _rows_for(mib: float, multiple: int) -> int:
    rows = max(multiple, int(mib * 2**20) // (WIDTH * 4))
    return rows - rows % multiple


def bench_dp_proto(
    wg: RayWorkerGroup, sizes_mib: list[float], repeat: int, max_repeat: int
) -> list[dict[str, float]]:
    bare = [BareArray.remote() for _ in range(4)]
    ray.get([a.echo.remote(np.zeros(1)) for a in bare])
    results = []
    try:
        wg.echo(DataProto.from_dict({"x": torch.zeros(4, 2)}))
        for mib in sizes_mib:
            results.append(_dp_proto_one(wg, bare, mib, repeat, max_repeat))
            print(f"dp_proto {mib:g} MiB: {results[-1]}", flush=True)
    finally:
        for a in bare:
            ray.kill(a)
    return results


def _dp_proto_one(
    wg: RayWorkerGroup, bare: list[Any], mib: float, repeat: int, max_repeat: int
) -> dict[str, float]:
    n_ranks = len(bare)
    rows = _rows_for(mib, n_ranks)
    tensor = torch.rand(rows, WIDTH)
    nbytes = tensor.numel() * 4
    data = DataProto.from_dict({"x": tensor})
    array = tensor.numpy()

    def raw_numpy() -> None:
        shards = np.array_split(array, n_ranks)
        refs = [a.echo.remote(ray.put(s)) for a, s in zip(bare, shards, strict=True)]
        out = np.concatenate(ray.get(refs))
        if out.shape != array.shape:
            raise RuntimeError("raw numpy trip lost rows")

    def torch_save() -> None:
        blobs = []
        for shard in torch.chunk(tensor, n_ranks):
            buf = io.BytesIO()
            torch.save(shard.clone(), buf)
            blobs.append(buf.getvalue())
        refs = [a.echo_torch_save.remote(b) for a, b in zip(bare, blobs, strict=True)]
        out = torch.cat([torch.load(io.BytesIO(b)) for b in ray.get(refs)])
        if out.shape != tensor.shape:
            raise RuntimeError("torch.save trip lost rows")

    def ours() -> None:
        out = wg.echo(data)
        if len(out) != rows:
            raise RuntimeError("sc-ray trip lost rows")

    fns = {"raw": raw_numpy, "ours": ours, "save": torch_save}
    for fn in fns.values():  # warm-up: first touch of the object store at this size
        fn()
    # Small sizes are quick and noisier: more repeats (3 at 512 MiB, up to max_repeat).
    n = max(repeat, min(max_repeat, int(repeat * 512 // max(mib, 1))))
    t = median_times(fns, n)
    gib = nbytes / 2**30
    return {
        "mib": nbytes / 2**20,
        "repeats": float(n),
        "raw_numpy_s": t["raw"],
        "sc_ray_s": t["ours"],
        "torch_save_s": t["save"],
        "raw_numpy_gib_s": gib / t["raw"],
        "sc_ray_gib_s": gib / t["ours"],
        "torch_save_gib_s": gib / t["save"],
        "ratio_vs_raw_numpy": t["raw"] / t["ours"],
        "ratio_vs_torch_save": t["save"] / t["ours"],
        "target_min_vs_raw_numpy": 0.7,
        "target_min_vs_torch_save": 5.0,
    }


def bench_dp_workers(workers: list[int], mib: float, repeat: int) -> list[dict[str, float]]:
    """A small DataProto round trip on n workers vs numpy shards to n bare actors."""
    rows_out = []
    for n in workers:
        bare = [BareArray.remote() for _ in range(n)]
        ray.get([a.echo.remote(np.zeros(1)) for a in bare])
        try:
            with _group(ProtoWorker, n) as wg:
                wg.echo(DataProto.from_dict({"x": torch.zeros(n, 2)}))
                row = _dp_proto_one(wg, bare, mib, repeat, repeat)
        finally:
            for a in bare:
                ray.kill(a)
        row["workers"] = float(n)
        row["ratio_time_vs_raw_numpy"] = row["sc_ray_s"] / row["raw_numpy_s"]
        row["target_max_time_vs_raw_numpy"] = 1.1
        print(f"dp_proto {mib:g} MiB x{n}: {row}", flush=True)
        rows_out.append(row)
    return rows_out


def bench_chain(producer: RayWorkerGroup, mib: float) -> dict[str, Any]:
    """The 4-rank group of the round trips produces, a 3-rank group consumes (a reshard)."""
    rows = _rows_for(mib, 12)
    data = DataProto.from_dict({"x": torch.rand(rows, WIDTH)})
    with _group(ProtoWorker, 3) as consumer:
        with SpanRecorder() as rec:
            first = producer.produce(data)
            second = consumer.consume(first)
            rows_out = len(second)  # row counts only: a few bytes of metadata
        spans: list[dict[str, Any]] = [
            {
                "call": f"{s.method} ({'non-blocking' if not s.blocking else 'blocking'})",
                "ranks": float(len(s.ranks)),
                "bytes_put": float(s.bytes_put),
                "bytes_fetched": float(s.bytes_fetched),
            }
            for s in rec.spans
        ]
        if rows_out != rows:
            raise RuntimeError("chain lost rows")
        del first, second
    result: dict[str, Any] = {
        "mib": rows * WIDTH * 4 / 2**20,
        "bytes_fetched_by_driver": float(sum(s.bytes_fetched for s in rec.spans)),
        "bytes_put_by_driver": float(sum(s.bytes_put for s in rec.spans)),
        "target_max_fetched_bytes": float(2**20),
        "spans": spans,
    }
    print(f"chain: {result}", flush=True)
    return result


def _start_bare(n: int) -> float:
    start = time.perf_counter()
    bare = [BareTorch.remote() for _ in range(n)]
    ray.get([a.ping.remote() for a in bare])
    elapsed = time.perf_counter() - start
    for a in bare:
        ray.kill(a)
    return elapsed


def _start_group(n: int) -> float:
    start = time.perf_counter()
    with _group(TorchWorker, n) as wg:
        wg.ping()
        elapsed = time.perf_counter() - start
    return elapsed


def bench_startup(n: int, rounds: int) -> dict[str, Any]:
    """Start-up times in ABBA order (bare, sc-ray, sc-ray, bare, ...): the first start on a
    fresh cluster finds worker processes Ray started ahead, and the load drifts; alternating
    the order and averaging cancels both to first order."""
    bare: list[float] = []
    ours: list[float] = []
    for i in range(rounds):
        steps = [(bare, _start_bare), (ours, _start_group)]
        for samples, fn in steps if i % 2 == 0 else steps[::-1]:
            samples.append(fn(n))
            time.sleep(2)  # let the killed actors' processes exit
    t_bare, t_ours = statistics.mean(bare), statistics.mean(ours)
    result = {
        "workers": float(n),
        "rounds": float(rounds),
        "bare_actors_s": t_bare,
        "sc_ray_s": t_ours,
        "ratio": t_ours / t_bare,
        "target_max": 1.3,
        "bare_actors_samples_s": bare,
        "sc_ray_samples_s": ours,
    }
    print(f"startup: {result}", flush=True)
    return result


def _ok(flag: bool) -> str:
    return "met" if flag else "NOT MET"


def print_table(results: dict[str, Any]) -> None:
    """Human-readable summary; ratios are against the baseline of the same run."""
    lines = [f"{'measurement':<52}{'sc-ray':>14}{'baseline':>14}{'ratio':>9}  goal"]
    for row in results.get("noop_sweep", []):
        lines.append(
            f"{'no-op ONE_TO_ALL, ' + str(int(row['workers'])) + ' workers (ms)':<52}"
            f"{row['sc_ray_s'] * 1e3:>14.3f}{row['raw_ray_s'] * 1e3:>14.3f}"
            f"{row['ratio']:>8.2f}x  <= 1.3x time"
            + (f" ({_ok(row['ratio'] <= 1.3)})" if row["workers"] == 8 else "")
        )
    for row in results.get("dp_proto_sweep", []):
        label = f"DP_COMPUTE_PROTO {row['mib']:.0f} MiB x4 (GiB/s)"
        big = row["mib"] >= 512
        lines.append(
            f"{label + ' vs numpy':<52}{row['sc_ray_gib_s']:>14.3f}{row['raw_numpy_gib_s']:>14.3f}"
            f"{row['ratio_vs_raw_numpy']:>8.2f}x  >= 0.7x throughput"
            + (f" ({_ok(row['ratio_vs_raw_numpy'] >= 0.7)})" if big else "")
        )
        lines.append(
            f"{label + ' vs torch.save':<52}{row['sc_ray_gib_s']:>14.3f}"
            f"{row['torch_save_gib_s']:>14.3f}{row['ratio_vs_torch_save']:>8.2f}x  >= 5x"
            + (f" ({_ok(row['ratio_vs_torch_save'] >= 5)})" if big else "")
        )
    if "chain" in results:
        c = results["chain"]
        lines.append(
            f"{'chain of 2 non-blocking calls, ' + format(c['mib'], '.0f') + ' MiB (bytes)':<52}"
            f"{c['bytes_fetched_by_driver']:>14.0f}{'':>14}{'':>9}  fetched < 1 MiB "
            f"({_ok(c['bytes_fetched_by_driver'] < 2**20)}; put {c['bytes_put_by_driver']:.0f})"
        )
    if "startup" in results:
        s = results["startup"]
        lines.append(
            f"{'start-up, ' + str(int(s['workers'])) + ' workers importing torch (s)':<52}"
            f"{s['sc_ray_s']:>14.2f}{s['bare_actors_s']:>14.2f}{s['ratio']:>8.2f}x  <= 1.3x "
            + (f"({_ok(s['ratio'] <= 1.3)})" if s["workers"] == 8 else "")
        )
    print("\n" + "\n".join(lines), flush=True)


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _memory_gib() -> float:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("integration/benchmarks/results/ray.json"))
    parser.add_argument("--workers", type=_int_list, default=None, help="no-op sweep: 1,2,4,8")
    parser.add_argument(
        "--sizes-mib", type=_float_list, default=None, help="DP_COMPUTE_PROTO sweep: 16,64,256,512"
    )
    parser.add_argument("--mib", type=float, default=None, help="one size (old flag: --sizes-mib)")
    parser.add_argument(
        "--dp-workers", type=_int_list, default=None, help="small DataProto sweep: 2,4,8"
    )
    parser.add_argument("--dp-workers-mib", type=float, default=None, help="its size (16)")
    parser.add_argument("--chain-mib", type=float, default=None, help="chain size (256)")
    parser.add_argument("--startup-workers", type=int, default=None, help="start-up: 8 workers")
    parser.add_argument(
        "--startup-rounds", type=int, default=None, help="start-ups of each kind, ABBA (2)"
    )
    parser.add_argument("--repeat", type=int, default=None, help="DataProto repeats at 512 MiB")
    parser.add_argument("--noop-repeat", type=int, default=None, help="no-op calls timed (200)")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, few repeats")
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["noop", "dp_proto", "dp_workers", "chain", "startup"],
    )
    args = parser.parse_args(argv)
    q = args.quick
    workers = sorted(set(args.workers or ([1, 2] if q else [1, 2, 4, 8])))
    sizes = sorted(
        set(args.sizes_mib or ([args.mib] if args.mib else ([1, 4] if q else [16, 64, 256, 512])))
    )
    chain_mib = args.chain_mib or (4 if q else 256)
    startup_workers = args.startup_workers or (2 if q else 8)
    startup_rounds = args.startup_rounds or (1 if q else 2)
    repeat = args.repeat or (1 if q else 3)
    noop_repeat = args.noop_repeat or (20 if q else 200)
    if min(workers) < 1 or max(workers) > CLUSTER_CPUS or min(sizes) <= 0:
        parser.error(f"workers must be in 1..{CLUSTER_CPUS} and sizes positive")

    store = max(2 * 2**30, int(5 * max([*sizes, chain_mib]) * 2**20))
    results: dict[str, Any] = {
        **stamp(
            "sc-ray",
            ray=ray.__version__,
            torch=torch.__version__,
            gpus=torch.cuda.device_count(),
            memory_gib=_memory_gib(),
        ),
        "quick": q,
        "cluster": {"num_cpus": CLUSTER_CPUS, "object_store_bytes": store},
    }
    ray.init(
        address="local",
        num_cpus=CLUSTER_CPUS,
        include_dashboard=False,
        object_store_memory=store,
        log_to_driver=False,
    )
    t0 = time.perf_counter()
    try:
        if "startup" not in args.skip:
            results["startup"] = bench_startup(startup_workers, startup_rounds)
        if "noop" not in args.skip:
            results["noop_sweep"] = bench_noop(workers, noop_repeat)
            results["noop"] = results["noop_sweep"][-1]
        if "dp_workers" not in args.skip:
            dp_workers = sorted(set(args.dp_workers or ([2] if q else [2, 4, 8])))
            dp_mib = args.dp_workers_mib or (1 if q else 16)
            results["dp_workers"] = bench_dp_workers(dp_workers, dp_mib, 5 if q else 40)
        if "dp_proto" not in args.skip or "chain" not in args.skip:
            with _group(ProtoWorker, 4) as proto_wg:
                if "dp_proto" not in args.skip:
                    sweep = bench_dp_proto(proto_wg, sizes, repeat, 3 if q else 15)
                    results["dp_proto_sweep"] = sweep
                    results["dp_proto"] = sweep[-1]
                if "chain" not in args.skip:
                    results["chain"] = bench_chain(proto_wg, chain_mib)
        print(f"measured in {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        ray.shutdown()
    results["wall_s"] = time.perf_counter() - t0
    results["machine"]["loadavg_at_end"] = list(os.getloadavg())
    print_table(results)
    write_result(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
