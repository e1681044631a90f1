"""Pipeline stages: the dp shard to the first and last stage only, metadata to the others.

    uv run python integration/benchmarks/bench_stage_dispatch.py   # results/stage_dispatch.json
    uv run python integration/benchmarks/bench_stage_dispatch.py --quick --out /tmp/s.json

A PPO-sized DataProto (``--rows`` 256 rows of ``--tokens`` 512 tokens, half prompt and half
response: ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``,
``response_mask``, ``old_log_probs``, ``advantages``, ``ref_log_prob``) is dispatched with
``make_nd_compute_dataproto_dispatch_fn`` to pp x dp x tp layouts (pp 2 and 4, dp 2, tp 1
and 2; pp slowest, tp fastest, the collect rank tp 0 of the last stage), registered two
ways on the same workers:

* ``first_last``: the first and last stage registered with ``receives_data=True``, the
  middle stages with ``receives_data=False`` (they get a DataProto of the same row count and
  ``meta_info``, no columns);
* ``every_rank``: every rank receives its dp shard (what the nd dispatch did before).

For each layout:

* ``bytes``: the payload bytes delivered to the workers per call (the sum over ranks of
  ``WorkPlan.rank_nbytes()``: a shard that several ranks receive counts once for each), for
  both, and ``ratio`` (first_last / every_rank); the bytes the driver put into the object
  store per call (``bytes_put`` of the call spans) beside it: a shard that several ranks
  read is put once either way, so the savings are what the workers fetch and unpickle;
* ``wall``: the median wall time of the blocking call through a real ``RayWorkerGroup``
  (``ray.init(num_cpus=8)``, each worker 0.1 CPU), both registrations taking turns in one
  run (ABBA), ``--repeat`` calls each after ``--warmup``, and their ratio.

The worker method reads the size of every column it got and returns one int per row from
the collect ranks. One group of 16 workers is started; a layout of fewer ranks runs on its
first ranks (``RayWorkerGroup.from_detached(worker_handles=...)``), so that the bench stays
near two minutes on a small machine, most of it worker start-up. ``--quick`` is a smoke run
(pp 2 only, 3 repeats); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import ray
import torch
from _machine import median_times, stamp, write_result  # this folder: the script's own
from sc_core import SpanRecorder, Worker
from sc_dispatch import Dispatch, Execute, make_nd_compute_dataproto_dispatch_fn, register
from sc_dispatch.ext import payload_nbytes
from sc_protocol import DataProto
from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

CLUSTER_CPUS = 8
ACTOR_CPUS = 0.1
DP = 2
#: (pp, tp) of every layout, dp 2.
LAYOUTS = [(2, 1), (2, 2), (4, 1), (4, 2)]
WAYS = ("first_last", "every_rank")


def mesh_name(pp: int, tp: int, way: str) -> str:
    return f"pp{pp}_dp{DP}_tp{tp}_{way}"


def _forward(self: Worker, data: DataProto) -> DataProto:
    # read every column the rank got (a middle stage gets none), return one int per row
    columns = [] if data.batch is None else list(data.batch.keys())
    total = sum(int(data.batch[k].numel()) for k in columns) if data.batch is not None else 0
    return DataProto.from_dict({"seen": torch.full((len(data),), total, dtype=torch.int64)})


def _register_layout(self: Worker, pp: int, tp: int) -> None:
    """This rank's place in pp x dp x tp (pp slowest, tp fastest), registered both ways."""
    stage, rest = divmod(self.rank, DP * tp)
    dp_rank, tp_rank = divmod(rest, tp)
    collect = stage == pp - 1 and tp_rank == 0
    for way in WAYS:
        receives = way == "every_rank" or stage in (0, pp - 1)
        self._register_dispatch_collect_info(mesh_name(pp, tp, way), dp_rank, collect, receives)


def _stage_worker_class() -> type[Worker]:
    """A Worker with ``register_layout`` and one nd method per layout and registration."""
    _register_layout.__name__ = _register_layout.__qualname__ = "register_layout"
    namespace: dict[str, Any] = {
        "register_layout": register(dispatch_mode=Dispatch.ONE_TO_ALL)(_register_layout)
    }
    for pp, tp in LAYOUTS:
        for way in WAYS:
            name = mesh_name(pp, tp, way)

            def forward(self: Worker, data: DataProto) -> DataProto:
                return _forward(self, data)

            forward.__name__ = forward.__qualname__ = f"forward_{name}"
            mode = make_nd_compute_dataproto_dispatch_fn(name)
            namespace[forward.__name__] = register(dispatch_mode=mode)(forward)
    return type("StageWorker", (Worker,), namespace)


StageWorker = _stage_worker_class()


def ppo_batch(rows: int, tokens: int) -> DataProto:
    """A PPO step's batch: prompt + response of ``tokens`` tokens (half each)."""
    response = tokens // 2
    ids = torch.randint(0, 32000, (rows, tokens))
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": torch.ones(rows, tokens, dtype=torch.int64),
            "position_ids": torch.arange(tokens).expand(rows, tokens).contiguous(),
            "responses": ids[:, -response:].contiguous(),
            "response_mask": torch.ones(rows, response, dtype=torch.int64),
            "old_log_probs": torch.randn(rows, response),
            "advantages": torch.randn(rows, response),
            "ref_log_prob": torch.randn(rows, response),
        },
        meta_info={"temperature": 1.0, "global_steps": 1},
    )


def measure_layout(
    wg: RayWorkerGroup, pp: int, tp: int, data: DataProto, warmup: int, repeat: int
) -> dict[str, Any]:
    methods = {way: getattr(wg, f"forward_{mesh_name(pp, tp, way)}") for way in WAYS}
    delivered: dict[str, int] = {}
    per_rank: dict[str, list[int]] = {}
    put: dict[str, int] = {}
    outputs: dict[str, list[int]] = {}
    for way, method in methods.items():
        plan = method.spec.plan(wg, Execute.ALL, (data,), {})
        sizes = plan.rank_nbytes()
        per_rank[way] = [sizes.get(r, 0) for r in range(wg.world_size)]
        delivered[way] = sum(sizes.values())
        with SpanRecorder() as rec:
            out = method(data)
        (span,) = rec.spans
        put[way] = span.bytes_put
        outputs[way] = out.batch["seen"].tolist()
    if outputs["first_last"] != outputs["every_rank"]:
        raise RuntimeError(f"pp {pp} tp {tp}: the two registrations disagree on the output")
    calls: dict[str, Callable[[], Any]] = {
        way: functools.partial(m, data) for way, m in methods.items()
    }
    median_times(calls, warmup)
    wall = median_times(calls, repeat)
    row = {
        "pp": pp,
        "dp": DP,
        "tp": tp,
        "world_size": wg.world_size,
        "bytes_delivered": delivered,
        "bytes_delivered_per_rank": per_rank,
        "bytes_ratio": delivered["first_last"] / delivered["every_rank"],
        "expected_bytes_ratio": 2 / pp,
        "bytes_put_by_driver": put,
        "wall_s": wall,
        "wall_ratio": wall["first_last"] / wall["every_rank"],
    }
    print(
        f"pp {pp} dp {DP} tp {tp}: bytes {delivered['first_last']} / "
        f"{delivered['every_rank']} = {row['bytes_ratio']:.3f}; wall "
        f"{wall['first_last'] * 1e3:.1f} / {wall['every_rank'] * 1e3:.1f} ms = "
        f"{row['wall_ratio']:.3f}",
        flush=True,
    )
    return row


def measure(
    rows: int, tokens: int, layouts: list[tuple[int, int]], warmup: int, repeat: int
) -> dict[str, Any]:
    data = ppo_batch(rows, tokens)
    world = max(pp * DP * tp for pp, tp in layouts)
    started = time.perf_counter()
    pool = RayResourcePool([world], use_gpu=False, num_cpus_per_process=ACTOR_CPUS)
    cia = RayClassWithInitArgs(StageWorker)
    results = []
    with RayWorkerGroup(pool, cia) as main:
        startup_s = time.perf_counter() - started
        print(f"{world} workers up in {startup_s:.1f} s", flush=True)
        for pp, tp in layouts:
            size = pp * DP * tp
            # a smaller layout runs on the first ranks of the same actors (never closed: that
            # would kill them; the main group does)
            wg = (
                main
                if size == world
                else RayWorkerGroup.from_detached(
                    worker_handles=main.workers[:size], ray_cls_with_init=cia
                )
            )
            wg.register_layout(pp, tp)
            results.append(measure_layout(wg, pp, tp, data, warmup, repeat))
    return {
        "batch_bytes": payload_nbytes(data),
        "rows": rows,
        "tokens": tokens,
        "workers_started": world,
        "startup_s": startup_s,
        "layouts": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=Path("integration/benchmarks/results/stage_dispatch.json")
    )
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=31)
    parser.add_argument("--quick", action="store_true", help="smoke run: pp 2 only, 3 repeats")
    args = parser.parse_args(argv)
    layouts = [(pp, tp) for pp, tp in LAYOUTS if pp == 2] if args.quick else LAYOUTS
    repeat = 3 if args.quick else args.repeat
    warmup = 1 if args.quick else args.warmup
    started = time.perf_counter()
    head = stamp(
        "nd dispatch to pipeline stages: first/last stage only vs every rank (Ray)",
        ray=ray.__version__,
        torch=torch.__version__,
    )
    ray.init(num_cpus=CLUSTER_CPUS, include_dashboard=False, log_to_driver=False)
    try:
        result = measure(args.rows, args.tokens, layouts, warmup, repeat)
    finally:
        ray.shutdown()
    out = {
        **head,
        "machine": {**head["machine"], "loadavg_at_end": list(os.getloadavg())},
        "quick": args.quick,
        "cluster": {"num_cpus": CLUSTER_CPUS, "cpus_per_worker": ACTOR_CPUS},
        "repeat": repeat,
        "elapsed_s": time.perf_counter() - started,
        "result": result,
    }
    write_result(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
