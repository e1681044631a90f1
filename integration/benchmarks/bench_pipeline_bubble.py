"""The pipeline bubble of 1F1B, measured per stage against the schedule's (p-1)/(m+p-1).

    uv run python integration/benchmarks/bench_pipeline_bubble.py   # results/pipeline_bubble.json
    uv run python integration/benchmarks/bench_pipeline_bubble.py --quick --out /tmp/b.json

p=2 gloo processes (one torch thread each) run sc-workers' ``PipelineEngine`` on the built-in
model (``--hidden`` 256, 4 layers, ``--seq`` 128 tokens per row) and train it with the 1F1B
schedule (and GPipe beside it) for m = 2, 4 and 8 micro-batches of ``--micro`` rows. Each
rank records a span per step: its wall time, and the CPU time of its own thread in it
(``time.thread_time``). A stage's thread uses the CPU while it computes, and sleeps while it
waits for its neighbour's activations or gradients (gloo blocks in a condition wait), so
``idle = wall - cpu`` is its share of the bubble (communication included). The measured
bubble of a step is the mean idle fraction of the stages; the bench reports its median over
``--repeat`` steps after ``--warmup``, the theoretical (p-1)/(m+p-1) beside it, and their
ratio. On a machine with fewer free cores than stages the stages also wait for a CPU, which
the thread time does not count as work: run it on an idle machine (the result records the
load average).
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine, write_result
from sc_core.backend import free_port

RESULT = Path(__file__).resolve().parent / "results" / "pipeline_bubble.json"


def _rank(rank: int, args: dict[str, Any], port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist
    from sc_workers import FSDPConfig, MegatronConfig, ModelConfig, OptimConfig
    from sc_workers.engine import ParallelLayout, make_engine

    hidden, seq, micro = args["hidden"], args["seq"], args["micro"]
    model = ModelConfig(
        vocab_size=512,
        hidden_size=hidden,
        num_hidden_layers=4,
        num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden,
        max_position_embeddings=seq,
        seed=0,
    )
    results: dict[str, Any] = {}
    for schedule in ("1F1B", "GPipe"):
        layout = ParallelLayout.create(2, rank, pp_size=2)
        meg = MegatronConfig(pipeline_model_parallel_size=2, pipeline_schedule=schedule)  # type: ignore[arg-type]  # a checked Literal
        engine = make_engine(
            "megatron",
            model,
            FSDPConfig(param_dtype="float32"),
            layout,
            torch.device("cpu"),
            OptimConfig(lr=1e-4),
            megatron=meg,
        )
        engine.build()
        engine.train_mode()
        for m in args["micro_batches"]:
            gen = torch.Generator().manual_seed(m)
            ids = torch.randint(0, 512, (m * micro, seq), generator=gen)
            mask = torch.ones_like(ids)
            pos = torch.arange(seq).expand_as(ids)
            inputs = [
                (ids[i * micro : (i + 1) * micro], mask[:micro], pos[:micro]) for i in range(m)
            ]
            heads = [_head] * m

            def loss_fn(output: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
                return output.float().pow(2).mean()

            spans = []
            for step in range(args["warmup"] + args["repeat"]):
                engine.zero_grad()
                dist.barrier()
                wall0, cpu0 = time.perf_counter(), time.thread_time()
                engine.train_step(inputs if layout.is_first_stage else [], heads, loss_fn)
                wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
                if step >= args["warmup"]:
                    spans.append((wall, cpu))
            results[f"{schedule}/m{m}"] = spans
    dist.destroy_process_group()
    torch.save(results, Path(out) / f"rank{rank}.pt")


def _head(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, :]


def _run(args: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    port = free_port("127.0.0.1")
    procs = [ctx.Process(target=_rank, args=(r, args, port, str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=1200)
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"bench ranks exited with {failed}")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro", type=int, default=4, help="rows per micro-batch")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a smoke run; figures mean nothing")
    parser.add_argument("--out", type=Path, default=RESULT)
    ns = parser.parse_args()
    args = {
        "hidden": 64 if ns.quick else ns.hidden,
        "seq": 16 if ns.quick else ns.seq,
        "micro": ns.micro,
        "warmup": 1 if ns.quick else ns.warmup,
        "repeat": 2 if ns.quick else ns.repeat,
        "micro_batches": [2, 4] if ns.quick else [2, 4, 8],
    }
    load_before = os.getloadavg()[0]
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        ranks = _run(args, Path(tmp))
    p = 2
    rows: dict[str, Any] = {}
    for key in ranks[0]:
        schedule, m_text = key.split("/")
        m = int(m_text[1:])
        per_step = []
        for step in range(len(ranks[0][key])):
            idle = [1 - cpu / wall for wall, cpu in (r[key][step] for r in ranks)]
            per_step.append(sum(idle) / len(idle))
        measured = statistics.median(per_step)
        # GPipe's bubble is the same (p-1)/(m+p-1): all forwards, then all backwards
        theory = (p - 1) / (m + p - 1)
        walls = [statistics.median(w for w, _ in r[key]) for r in ranks]
        rows[key] = {
            "schedule": schedule,
            "micro_batches": m,
            "bubble_measured": round(measured, 4),
            "bubble_theoretical": round(theory, 4),
            "measured_over_theoretical": round(measured / theory, 3),
            "step_wall_s": round(max(walls), 4),
            "idle_per_stage": [
                round(statistics.median(1 - c / w for w, c in r[key]), 4) for r in ranks
            ],
        }
        print(
            f"{key:12s} bubble {measured:.3f} (theory {theory:.3f}, x{measured / theory:.2f}), "
            f"step {max(walls) * 1000:.0f} ms"
        )
    write_result(
        ns.out,
        {
            "bench": "pipeline_bubble",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "stages": p,
            "settings": args,
            "results": rows,
            "machine": machine(torch=torch.__version__, load_before=round(load_before, 2)),
        },
    )


if __name__ == "__main__":
    main()
