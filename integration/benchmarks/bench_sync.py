"""Weight-sync benchmark: sc-workers' planned sync against raw torch.distributed baselines.

    uv run python integration/benchmarks/bench_sync.py            # results/sync.json
    uv run python integration/benchmarks/bench_sync.py --quick    # a smoke run

* ``plan``: building the transfer plan for a model of 10,000 tensors (trainer FSDP dp=4,
  rollout TP=2 x 2 replicas), uncached, median of 5;
* ``sync``: a model of about ``--mib`` MiB of float32 from 2 trainer processes (FSDP-style
  dim-0 shards) to 2 rollout processes (tensor parallel, one replica), over gloo on this
  machine, in two layouts:

  - ``transformer`` (``results["sync"]``): decoder layers of hidden size 1024 (q, k, v, o,
    gate, up, down, two norms), split as Megatron splits them: column-parallel weights along
    dim 0 (their pieces are contiguous on both sides and travel without a copy), row-parallel
    ones (o, down: a third of the bytes) along dim 1, norms replicated;
  - ``row-parallel`` (``results["sync_row_parallel"]``): the worst case, every tensor a
    1024 x 1024 matrix split along dim 1, so every byte is packed by its sender;

  each variant timed between barriers, in turns (median of ``--repeat``):

  - ``sc``: ``send_weights`` / ``receive_weights`` / ``commit`` (packing, one message per
    sender-receiver pair, staging, the switch to the new version);
  - ``raw``: a raw ``send``/``recv`` of the same bytes per pair between the same processes
    (pre-allocated flat buffers: the floor for moving these bytes);
  - ``raw_framed``: the same bytes cut into sc's frames (one pre-allocated buffer per frame,
    no packing, no staging): what the message count alone costs over gloo;
  - ``broadcast``: the naive way, trainer rank 0 holding the full model and broadcasting every
    tensor to the rollout ranks, which keep their slices;
  - ``delta``: the delta path (``WeightSync(delta=True)``), after 2 % of every sender's
    elements changed (changed outside the timing), against the previous version's messages;
    its bytes on the wire beside the dense bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _machine import stamp, write_result  # this folder: the script's own
from sc_workers.sync import (
    ChannelSpec,
    ModelLayout,
    Region,
    build_plan,
    open_channel,
    receive_weights,
    send_weights,
)
from sc_workers.sync._frames import frames_of

SENDERS, RECEIVERS = 2, 2
SIDE = 1024
HIDDEN, FFN = 1024, 2816


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _chunk(n: int, parts: int, i: int) -> tuple[int, int]:
    size = -(-n // parts)
    return min(i * size, n), min((i + 1) * size, n)


def model(layout: str, mib: float) -> tuple[dict[str, tuple[int, ...]], dict[str, int | None]]:
    """Parameter shapes of about ``mib`` MiB, and the dimension tensor parallelism splits each
    along (``None``: replicated)."""
    if layout == "row-parallel":
        count = max(1, int(mib * 2**20) // (SIDE * SIDE * 4))
        return {f"w{i}": (SIDE, SIDE) for i in range(count)}, dict.fromkeys(
            (f"w{i}" for i in range(count)), 1
        )
    per_layer = {
        "q": ((HIDDEN, HIDDEN), 0),
        "k": ((HIDDEN, HIDDEN), 0),
        "v": ((HIDDEN, HIDDEN), 0),
        "o": ((HIDDEN, HIDDEN), 1),
        "gate": ((FFN, HIDDEN), 0),
        "up": ((FFN, HIDDEN), 0),
        "down": ((HIDDEN, FFN), 1),
        "norm1": ((HIDDEN,), None),
        "norm2": ((HIDDEN,), None),
    }
    layer_bytes = 4 * sum(math.prod(shape) for shape, _ in per_layer.values())
    shapes: dict[str, tuple[int, ...]] = {}
    split: dict[str, int | None] = {}
    for i in range(max(1, round(mib * 2**20 / layer_bytes))):
        for name, (shape, dim) in per_layer.items():
            shapes[f"layers.{i}.{name}"] = shape
            split[f"layers.{i}.{name}"] = dim
    return shapes, split


def layouts(
    shapes: dict[str, tuple[int, ...]],
    senders: int,
    tp: int,
    replicas: int,
    split: dict[str, int | None] | None = None,
) -> tuple[ModelLayout, ModelLayout]:
    """Trainer: dim 0 split over ``senders``; rollout: each tensor split over tp along
    ``split[name]`` (default: the last dim; ``None``: whole), replicated. Equal boxes are one
    Region object, as in layouts built from the ranks' reports."""
    dtypes = dict.fromkeys(shapes, "float32")
    boxes: dict[tuple[tuple[int, ...], tuple[int, ...]], Region] = {}

    def box(offset: tuple[int, ...], shape: tuple[int, ...]) -> Region:
        return boxes.setdefault((offset, shape), Region(offset, shape))

    src = []
    for s in range(senders):
        held = {}
        for name, shape in shapes.items():
            lo, hi = _chunk(shape[0], senders, s)
            if hi > lo:
                held[name] = box((lo, *([0] * (len(shape) - 1))), (hi - lo, *shape[1:]))
        src.append(held)
    dst = []
    for _ in range(replicas):
        for t in range(tp):
            held = {}
            for name, shape in shapes.items():
                dim = len(shape) - 1 if split is None else split[name]
                if dim is None:
                    held[name] = box((0,) * len(shape), shape)
                    continue
                lo, hi = _chunk(shape[dim], tp, t)
                if hi > lo:
                    offset = tuple(lo if d == dim else 0 for d in range(len(shape)))
                    size = tuple(hi - lo if d == dim else n for d, n in enumerate(shape))
                    held[name] = box(offset, size)
            dst.append(held)
    return ModelLayout(shapes, dtypes, tuple(src)), ModelLayout(shapes, dtypes, tuple(dst))


def bench_plan(tensors: int) -> dict[str, Any]:
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(tensors):  # a transformer's mix: matrices, vectors, a few odd shapes
        kind = i % 5
        shapes[f"layers.{i // 5}.p{kind}"] = [(512, 512), (512,), (2048, 512), (512, 2048), (7,)][
            kind
        ]
    src, dst = layouts(shapes, 4, 2, 2)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        plan = build_plan(src, dst)
        times.append(time.perf_counter() - start)
    return {"tensors": tensors, "pieces": plan.piece_count, "build_s": statistics.median(times)}


def _rank(
    rank: int, world: int, ports: tuple[int, int], layout: str, mib: float, repeat: int, out: str
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{ports[0]}", rank=rank, world_size=world
    )
    shapes, split = model(layout, mib)
    src, dst = layouts(shapes, SENDERS, RECEIVERS, 1, split)
    plan = build_plan(src, dst)
    channel = open_channel(ChannelSpec("gloo", "bench", world, port=ports[1]), rank)
    gen = torch.Generator().manual_seed(0)
    full = {n: torch.randn(s, generator=gen) for n, s in shapes.items()} if rank == 0 else {}
    if rank < SENDERS:
        held = {}
        for name, region in src.ranks[rank].items():
            t = torch.randn(region.shape, generator=gen)
            held[name] = (t, region)
    else:
        r = rank - SENDERS
        targets = {n: (torch.zeros(reg.shape), reg) for n, reg in dst.ranks[r].items()}
    # raw baseline: the same bytes per pair, pre-allocated flat buffers
    pair_bytes = {pair: sum(p.nbytes for p in pieces) for pair, pieces in plan.by_pair.items()}
    raw_send = {
        d: torch.empty(n, dtype=torch.uint8) for (s, d), n in pair_bytes.items() if s == rank
    }
    raw_recv = {
        s: torch.empty(n, dtype=torch.uint8)
        for (s, d), n in pair_bytes.items()
        if d == rank - SENDERS
    }
    # raw in sc's frames: one buffer per frame, the same tags
    framed_send = [
        (SENDERS + d, f.tag, torch.empty(f.nbytes, dtype=torch.uint8))
        for (s, d), pieces in plan.by_pair.items()
        if s == rank
        for f in frames_of(pieces)
    ]
    framed_recv = [
        (s, f.tag, torch.empty(f.nbytes, dtype=torch.uint8))
        for (s, d), pieces in plan.by_pair.items()
        if d == rank - SENDERS
        for f in frames_of(pieces)
    ]
    receivers = list(range(SENDERS, world))
    bcast_group: Any = dist.new_group([0, *receivers])

    # reused from sync to sync, as the workers do
    buffers: dict[int, torch.Tensor] = {}
    spare: dict[str, torch.Tensor] = {}

    def sc() -> None:
        nonlocal buffers, spare
        if rank < SENDERS:
            buffers = send_weights(channel, plan, rank, held, buffers=buffers).messages
        else:
            got = receive_weights(
                channel, plan, rank - SENDERS, targets, 1, buffers=buffers, spare=spare
            )
            spare = got.staged.commit()
            buffers = got.messages

    def raw() -> None:
        works = [dist.isend(t, SENDERS + d) for d, t in raw_send.items()]
        works += [dist.irecv(t, s) for s, t in raw_recv.items()]
        for w in works:
            if w is not None:
                w.wait()

    def raw_framed() -> None:
        works = [dist.isend(t, peer, tag=tag) for peer, tag, t in framed_send]
        works += [dist.irecv(t, peer, tag=tag) for peer, tag, t in framed_recv]
        for w in works:
            if w is not None:
                w.wait()

    def broadcast() -> None:
        if rank not in (0, *receivers):
            return
        for name, shape in shapes.items():
            t = full[name] if rank == 0 else torch.empty(shape)
            dist.broadcast(t, 0, group=bcast_group)
            if rank >= SENDERS:
                tensor, region = targets[name]
                tensor.copy_(t[region.within(Region.full(shape))])

    # the delta path: baselines from a first (dense) round, then 2 % of the elements change
    baseline: dict[int, torch.Tensor] = {}
    delta_wire: list[int] = []
    delta_spare: dict[str, torch.Tensor] = {}

    def delta() -> None:
        nonlocal baseline, delta_spare
        if rank < SENDERS:
            sent = send_weights(channel, plan, rank, held, baseline=baseline)
            baseline = sent.messages
            delta_wire.append(sent.wire_bytes)
        else:
            got = receive_weights(
                channel, plan, rank - SENDERS, targets, 1, baseline=baseline, spare=delta_spare
            )
            delta_spare = got.staged.commit()
            baseline = got.messages

    def perturb(fraction: float) -> None:
        if rank >= SENDERS:
            return
        with torch.no_grad():
            for tensor, _ in held.values():
                flat = tensor.view(-1)
                count = max(1, int(flat.numel() * fraction))
                flat[torch.randint(flat.numel(), (count,), generator=gen)] += 1e-3

    variants = {"sc": sc, "raw": raw, "raw_framed": raw_framed, "broadcast": broadcast}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(repeat + 1):  # the first round warms up
        order = list(variants.items())
        for name, fn in order if i % 2 == 0 else order[::-1]:
            dist.barrier()
            start = time.perf_counter()
            fn()
            dist.barrier()
            if i:
                times[name].append(time.perf_counter() - start)
    times["delta"] = []
    for i in range(repeat + 1):  # the first round is dense: it sets the baselines
        perturb(0.02)
        dist.barrier()
        start = time.perf_counter()
        delta()
        dist.barrier()
        if i:
            times["delta"].append(time.perf_counter() - start)
    if rank == 0:
        result: dict[str, Any] = {
            "layout": layout,
            "mib": sum(4 * math.prod(s) for s in shapes.values()) / 2**20,
            "tensors": len(shapes),
            "senders": SENDERS,
            "receivers": RECEIVERS,
            "bytes_moved": plan.total_bytes,
            "sent_per_sender": [plan.sent_by(s) for s in range(SENDERS)],
            **{f"{k}_s": statistics.median(v) for k, v in times.items()},
        }
        result["sc_over_raw"] = result["sc_s"] / result["raw_s"]
        result["raw_framed_over_raw"] = result["raw_framed_s"] / result["raw_s"]
        result["frames_per_sender"] = len(framed_send)
        result["sc_over_broadcast"] = result["sc_s"] / result["broadcast_s"]
        result["delta_over_sc"] = result["delta_s"] / result["sc_s"]
        # rank 0's share of the wire, per delta round, against the dense bytes it sends
        dense = plan.sent_by(0)
        result["delta_wire_fraction"] = statistics.median(delta_wire[1:]) / dense
        Path(out).write_text(json.dumps(result), encoding="utf-8")
    channel.close()
    dist.destroy_process_group()


def bench_sync(layout: str, mib: float, repeat: int) -> dict[str, Any]:
    world = SENDERS + RECEIVERS
    ports = (_port(), _port())
    out = Path(f"/tmp/sc-bench-sync-{os.getpid()}.json")
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_rank, args=(r, world, ports, layout, mib, repeat, str(out)))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=900)
    failed = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode != 0}
    if failed:
        raise RuntimeError(f"bench_sync: ranks exited with {failed}")
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    out.unlink()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path("integration/benchmarks/results/sync.json")
    )
    parser.add_argument("--mib", type=float, default=256.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--plan-tensors", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="16 MiB, one repeat, 1000 tensors")
    args = parser.parse_args(argv)
    if args.quick:
        args.mib, args.repeat, args.plan_tensors = 16.0, 1, 1000
    results: dict[str, Any] = stamp("weight sync", torch=torch.__version__)
    results["plan"] = bench_plan(args.plan_tensors)
    print(f"plan: {results['plan']}", flush=True)
    for key, layout in (("sync", "transformer"), ("sync_row_parallel", "row-parallel")):
        results[key] = bench_sync(layout, args.mib, args.repeat)
        print(f"{key}: {results[key]}", flush=True)
    write_result(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
