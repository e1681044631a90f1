"""Worker start-up: a realistic sc-ray worker against bare Ray actors, in the same run.

    uv run python integration/benchmarks/bench_startup.py   # writes results/startup.json
    uv run python integration/benchmarks/bench_startup.py --quick --out /tmp/startup.json  # smoke

``workers`` (for 2 and 4 workers, ``--workers``): the time from creating the actors to the
answer of their first call, each variant in fresh actors (new processes), ``--repeats`` (3)
times, the variants in a rotated order each repeat (reversed every other one) so that the
drift of a shared machine's load hits them alike; medians and ranges. One untimed start of one
worker comes first (Ray's own worker processes start meanwhile; the page cache warms). The
variants (``--variants``; the first four by default):

* ``torch``: bare Ray actors whose module imports torch, answering one call (the baseline
  every ratio is taken against);
* ``tensordict``: bare Ray actors whose module imports torch and tensordict plainly;
* ``bare_proto``: bare Ray actors whose module imports sc-protocol, echoing a DataProto shard;
* ``sc_proto``: a RayWorkerGroup of a worker whose module imports sc-protocol, from the
  construction of its pool to the first ``DP_COMPUTE_PROTO`` call that receives and returns
  a small DataProto (the realistic worker; target <= 1.3x ``torch``);
* ``sc_proto_eager``: the same worker behind a plain ``import tensordict``, as every worker
  started before sc-protocol deferred tensordict's ``torch.compile`` marks.

Each worker also reports its process's CPU seconds at its first answer; their sum over the
cores of the machine is the floor of a start-up that is CPU-bound.

``imports``: ``python -c "import X"`` in fresh interpreters (``--import-repeats``, 3), wall and
CPU seconds, for torch, tensordict, sc_protocol and sc_protocol with ``SC_PROTOCOL_EAGER_DYNAMO=1``.

The worker classes live in the ``_startup_*.py`` modules next to this script, so that Ray's
worker processes import them as they import real worker code (this folder is put on their
``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
)
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import ray  # noqa: E402
import torch  # noqa: E402
from _machine import stamp, write_result  # noqa: E402 - this folder: the script's own
from sc_protocol import DataProto  # noqa: E402
from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402

CLUSTER_CPUS = 8
ACTOR_CPUS = 0.1  # as bench_ray.py: every actor asks for the same small share
VARIANTS = ("torch", "tensordict", "sc_proto", "sc_proto_eager")  # --variants adds bare_proto
BASELINE = "torch"
TARGET = 1.3

# (label, code run by "python -c", extra environment)
IMPORTS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("torch", "import torch", {}),
    ("torch, tensordict", "import torch, tensordict", {}),
    ("sc_protocol", "import sc_protocol", {}),
    (
        "sc_protocol, SC_PROTOCOL_EAGER_DYNAMO=1",
        "import sc_protocol",
        {"SC_PROTOCOL_EAGER_DYNAMO": "1"},
    ),
)


def _data(n: int) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(4.0 * n).reshape(2 * n, 2)}, meta_info={"step": 0}
    )


def _bare(module: str, name: str, method: str) -> Callable[[int], dict[str, Any]]:
    def start(n: int) -> dict[str, Any]:
        cls = getattr(__import__(module), name)
        remote = ray.remote(num_cpus=ACTOR_CPUS)(cls)
        data = _data(n)
        shards = data.chunk(n)
        t0 = time.perf_counter()
        actors = [remote.remote() for _ in range(n)]
        if method == "ping":
            stats = ray.get([a.ping.remote() for a in actors])
        else:
            outs = ray.get([a.echo.remote(s) for a, s in zip(actors, shards, strict=True)])
            if sum(len(o) for o in outs) != len(data):
                raise RuntimeError(f"{name}: the echo lost rows")
        elapsed = time.perf_counter() - t0
        if method != "ping":
            stats = ray.get([a.stats.remote() for a in actors])
        for a in actors:
            ray.kill(a)
        return {"s": elapsed, "workers": stats}

    return start


def _group(module: str, name: str) -> Callable[[int], dict[str, Any]]:
    def start(n: int) -> dict[str, Any]:
        cls = getattr(__import__(module), name)
        data = _data(n)
        t0 = time.perf_counter()
        pool = RayResourcePool([n], use_gpu=False, num_cpus_per_process=ACTOR_CPUS)
        with RayWorkerGroup(pool, RayClassWithInitArgs(cls)) as wg:
            constructed = time.perf_counter() - t0
            out = wg.echo(data)
            elapsed = time.perf_counter() - t0
            if len(out) != len(data) or "y" not in out.batch:
                raise RuntimeError(f"{name}: the first DP_COMPUTE_PROTO call lost rows")
            stats = wg.stats()
        return {"s": elapsed, "constructed_s": constructed, "workers": stats}

    return start


STARTS: dict[str, Callable[[int], dict[str, Any]]] = {
    "torch": _bare("_startup_torch", "TorchActor", "ping"),
    "tensordict": _bare("_startup_tensordict", "TensordictActor", "ping"),
    "bare_proto": _bare("_startup_proto", "BareProtoActor", "echo"),
    "sc_proto": _group("_startup_proto", "EchoWorker"),
    "sc_proto_eager": _group("_startup_proto_eager", "EagerEchoWorker"),
}


def _order(variants: list[str], repeat: int) -> list[str]:
    k = repeat % len(variants)
    order = variants[k:] + variants[:k]
    return order[::-1] if repeat % 2 else order


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "samples": values,
    }


def bench_workers(
    counts: list[int], repeats: int, variants: list[str], settle_s: float
) -> list[dict[str, Any]]:
    """Start-up of each variant for each worker count, fresh actors every time."""
    cores = os.cpu_count() or 1
    rows = []
    for n in counts:
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for r in range(repeats):
            for variant in _order(variants, r):
                run = STARTS[variant](n)
                runs[variant].append(run)
                print(f"startup x{n} repeat {r} {variant}: {run['s']:.2f} s", flush=True)
                time.sleep(settle_s)  # let the killed actors' processes exit
        base = [run["s"] for run in runs[BASELINE]]
        row: dict[str, Any] = {"workers": n, "repeats": repeats, "variants": {}}
        for variant, samples in runs.items():
            secs = [run["s"] for run in samples]
            cpu = [sum(w["cpu_s"] for w in run["workers"]) for run in samples]
            entry: dict[str, Any] = {
                "s": _summary(secs),
                # each repeat's ratio against the baseline of the same repeat
                "ratio": _summary([s / b for s, b in zip(secs, base, strict=True)]),
                "ratio_of_medians": statistics.median(secs) / statistics.median(base),
                "worker_cpu_s": _summary(cpu),
                "cpu_floor_s": statistics.median(cpu) / cores,
                "worker_import_s": _summary(
                    [w["import_s"] for run in samples for w in run["workers"]]
                ),
                "dynamo_loaded": any(w["dynamo_loaded"] for s in samples for w in s["workers"]),
            }
            if "constructed_s" in samples[0]:
                entry["constructed_s"] = _summary([run["constructed_s"] for run in samples])
            row["variants"][variant] = entry
        row["target_max"] = TARGET
        rows.append(row)
    return rows


def warm_up(settle_s: float) -> None:
    """One start of one worker that imports everything, not timed: the first start on a
    fresh cluster competes with the worker processes Ray starts ahead, and finds a cold page
    cache."""
    STARTS["sc_proto_eager"](1)
    time.sleep(settle_s)


def bench_imports(repeats: int) -> list[dict[str, Any]]:
    """Wall and CPU seconds of ``python -c "import X"``, the imports taking turns."""
    samples: dict[str, dict[str, list[float]]] = {
        label: {"wall": [], "cpu": []} for label, _, _ in IMPORTS
    }
    for r in range(repeats):
        for label, code, env in IMPORTS if r % 2 == 0 else IMPORTS[::-1]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", code], check=True, timeout=600, env={**os.environ, **env}
            )
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            samples[label]["wall"].append(wall)
            samples[label]["cpu"].append(cpu)
            print(f"import {label}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    base = statistics.median(samples["torch"]["cpu"])
    return [
        {
            "imports": label,
            "wall_s": _summary(s["wall"]),
            "cpu_s": _summary(s["cpu"]),
            "cpu_over_torch": statistics.median(s["cpu"]) / base,
        }
        for label, s in samples.items()
    ]


def print_table(results: dict[str, Any]) -> None:
    lines = []
    for row in results.get("imports", []):
        lines.append(
            f"python -c 'import {row['imports']}': {row['cpu_s']['median']:.2f} s CPU "
            f"({row['cpu_s']['min']:.2f}-{row['cpu_s']['max']:.2f}), "
            f"{row['wall_s']['median']:.2f} s wall, {row['cpu_over_torch']:.2f}x torch's CPU"
        )
    for row in results.get("workers", []):
        lines.append(f"\nstart-up of {row['workers']} workers ({row['repeats']} repeats):")
        for variant, e in row["variants"].items():
            ok = ""
            if variant == "sc_proto":
                ok = "  (<= 1.3x: " + ("met)" if e["ratio"]["median"] <= TARGET else "NOT MET)")
            lines.append(
                f"  {variant:<16}{e['s']['median']:>7.2f} s ({e['s']['min']:.2f}-"
                f"{e['s']['max']:.2f})  {e['ratio']['median']:.2f}x torch "
                f"({e['ratio']['min']:.2f}-{e['ratio']['max']:.2f})  workers' CPU "
                f"{e['worker_cpu_s']['median']:.1f} s, floor {e['cpu_floor_s']:.1f} s{ok}"
            )
    print("\n" + "\n".join(lines), flush=True)


def _section_start() -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_at_start": list(os.getloadavg()),
    }


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "startup.json")
    parser.add_argument("--workers", type=_int_list, default=None, help="worker counts: 2,4")
    parser.add_argument("--repeats", type=int, default=None, help="start-ups per variant (3)")
    parser.add_argument("--import-repeats", type=int, default=None, help="per import (3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 workers, 1 repeat")
    parser.add_argument(
        "--variants",
        type=lambda t: [v for v in t.split(",") if v],
        default=list(VARIANTS),
        help=f"comma-separated, from {','.join(STARTS)} (torch is always run)",
    )
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["imports", "workers"],
        help="sections not measured; an existing --out file keeps its figures for them",
    )
    args = parser.parse_args(argv)
    q = args.quick
    counts = args.workers or ([2] if q else [2, 4])
    repeats = args.repeats or (1 if q else 3)
    import_repeats = args.import_repeats or (1 if q else 3)
    if min(counts) < 1 or max(counts) > CLUSTER_CPUS or repeats < 1:
        parser.error(f"worker counts must be in 1..{CLUSTER_CPUS}, repeats positive")
    unknown = sorted(set(args.variants) - set(STARTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(STARTS)}")
    variants = [BASELINE, *(v for v in args.variants if v != BASELINE)]
    results: dict[str, Any] = {
        **stamp(
            "worker start-up",
            ray=ray.__version__,
            torch=torch.__version__,
            tensordict=__import__("tensordict").__version__,
        ),
        "quick": q,
        "cluster": {"num_cpus": CLUSTER_CPUS, "actor_cpus": ACTOR_CPUS},
    }
    t0 = time.perf_counter()
    sections: dict[str, Any] = {}
    results["sections"] = sections  # when and under what load each section ran
    if "imports" not in args.skip:
        sections["imports"] = _section_start()
        results["imports"] = bench_imports(import_repeats)
        sections["imports"]["loadavg_at_end"] = list(os.getloadavg())
    if "workers" not in args.skip:
        sections["workers"] = _section_start()
        ray.init(
            address="local", num_cpus=CLUSTER_CPUS, include_dashboard=False, log_to_driver=False
        )
        try:
            warm_up(1.0 if q else 5.0)
            results["workers"] = bench_workers(counts, repeats, variants, 1.0 if q else 2.0)
        finally:
            ray.shutdown()
        sections["workers"]["loadavg_at_end"] = list(os.getloadavg())
    results["wall_s"] = time.perf_counter() - t0
    results["machine"]["loadavg_at_end"] = list(os.getloadavg())
    if args.out.is_file():  # keep the sections this run skipped
        old = json.loads(args.out.read_text(encoding="utf-8"))
        for section in args.skip:
            if section in old:
                results[section] = old[section]
                kept = old.get("sections", {}).get(section, {"date": old.get("date")})
                sections[section] = {**kept, "kept_from_earlier_run": True}
    print_table(results)
    write_result(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
