"""Benchmark: moving a DataProto, against a torch.save round trip of the same batch.

Measured in one run, reported as ratios (baseline time / sc-protocol time):

* pickle protocol 5 with a ``buffer_callback`` (how Ray serializes), dumps + loads;
* plain ``pickle.dumps`` (default protocol) and protocol 5 without a callback, dumps + loads;
* the baseline: ``torch.save`` of the same tensors and columns into a ``BytesIO``, then
  ``torch.load`` from it;
* ``chunk(8)`` (views) and ``DataProto.concat`` of the 8 chunks, against ``torch.cat`` of the
  same tensors;
* row and column operations on the first ``--ops-mib`` (128) MiB of rows: ``select`` of two
  columns and ``union`` of two such halves (metadata only: absolute times), indexing with a
  permutation of half of the rows against ``index_select`` of each tensor (and numpy
  indexing of the object column), and ``repeat(2)`` against ``repeat_interleave`` of each
  tensor (and ``np.repeat``).

Peak extra memory is the larger of the RSS peak (sampled every millisecond in a separate
pass) and the tracemalloc peak, minus the memory held before the operation.

    uv run python integration/benchmarks/bench_protocol.py --size-mib 1024
    uv run python integration/benchmarks/bench_protocol.py --quick --out /tmp/protocol.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import io
import json
import os
import pickle
import platform
import statistics
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sc_protocol import DataProto

SEQ = 1024
# Bytes per row: input_ids int64 + attention_mask bool + old_log_probs bfloat16 + values float32.
ROW_BYTES = SEQ * (8 + 1 + 2 + 4)


def make_batch(size_mib: int) -> DataProto:
    rows = max(8, size_mib * 2**20 // ROW_BYTES)
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "input_ids": torch.randint(0, 50_000, (rows, SEQ), generator=gen),
        "attention_mask": torch.rand(rows, SEQ, generator=gen) > 0.1,
        "old_log_probs": torch.randn(rows, SEQ, generator=gen).to(torch.bfloat16),
        "values": torch.randn(rows, SEQ, generator=gen),
    }
    uid = np.array([f"uid-{i}" for i in range(rows)], dtype=object)
    return DataProto.from_dict(tensors, {"uid": uid}, {"temperature": 1.0})


def batch_bytes(dp: DataProto) -> int:
    assert dp.batch is not None
    return sum(t.numel() * t.element_size() for t in dp.batch.values())


# --- the operations ----------------------------------------------------------------------


def torch_save_roundtrip(dp: DataProto) -> Any:
    assert dp.batch is not None
    payload = {
        "batch": {k: v for k, v in dp.batch.items()},
        "non_tensor_batch": dp.non_tensor_batch,
        "meta_info": dp.meta_info,
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def pickle5_oob_roundtrip(dp: DataProto) -> Any:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=buffers)


def pickle_default_roundtrip(dp: DataProto) -> Any:
    return pickle.loads(pickle.dumps(dp))


def pickle5_inband_roundtrip(dp: DataProto) -> Any:
    return pickle.loads(pickle.dumps(dp, protocol=5))


# --- measuring ---------------------------------------------------------------------------


def best_times(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Best wall time of each function; the functions take turns, so that drift in the load
    of a shared machine hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            gc.collect()
            start = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - start)
            del result
    return {name: min(values) for name, values in times.items()}


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_extra_memory(fn: Callable[[], Any]) -> int:
    """Peak memory above the starting point while ``fn`` runs (its result included)."""
    gc.collect()
    base = _rss()
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    tracemalloc.start()
    try:
        result = fn()
        peak[0] = max(peak[0], _rss())
        _, traced_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        stop.set()
        sampler.join()
    del result
    gc.collect()
    return max(peak[0] - base, traced_peak)


def bench_ops(dp: DataProto, ops_mib: int, repeats: int) -> dict[str, float]:
    """select / union (metadata), and index / repeat (copies) against plain torch and numpy."""
    assert dp.batch is not None
    keys = list(dp.batch.keys())
    left, right = keys[: len(keys) // 2], keys[len(keys) // 2 :]
    select_s = median_time(lambda: dp.select(left, []), 200)
    union_s = median_time(lambda: dp.select(left, []).union(dp.select(right)), 200)

    rows = min(len(dp), max(8, ops_mib * 2**20 // ROW_BYTES))
    sub = dp.slice(0, rows)
    assert sub.batch is not None
    tensors = {k: sub.batch[k] for k in keys}
    uid = sub.non_tensor_batch["uid"]
    perm = np.random.default_rng(0).permutation(rows)[: rows // 2]
    perm_t = torch.from_numpy(perm)

    def torch_index() -> Any:
        return {k: t.index_select(0, perm_t) for k, t in tensors.items()}, uid[perm]

    def torch_repeat() -> Any:
        return {k: t.repeat_interleave(2, dim=0) for k, t in tensors.items()}, np.repeat(uid, 2)

    times = best_times(
        {
            "index": lambda: sub[perm],
            "torch_index_select": torch_index,
            "repeat2": lambda: sub.repeat(2, interleave=True),
            "torch_repeat_interleave2": torch_repeat,
        },
        max(3, repeats),
    )
    indexed = sub[perm]
    assert indexed.batch is not None
    assert all(torch.equal(indexed.batch[k], tensors[k][perm_t]) for k in keys)
    return {
        "ops_rows": float(rows),
        "ops_bytes": float(sum(t.numel() * t.element_size() for t in tensors.values())),
        "select2_s": select_s,
        "select2_union_s": union_s,
        **{f"{name}_s": seconds for name, seconds in times.items()},
        "index_over_torch": times["index"] / times["torch_index_select"],
        "repeat2_over_torch": times["repeat2"] / times["torch_repeat_interleave2"],
    }


def _memory_gib() -> float:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--size-mib", type=int, default=1024, help="batch size in MiB (default 1024)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per round trip")
    parser.add_argument(
        "--ops-mib", type=int, default=128, help="rows used by index/repeat (default 128 MiB)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 32 MiB, one repeat (figures mean nothing)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("integration/benchmarks/results/protocol.json"),
        help="where to write the JSON results",
    )
    args = parser.parse_args()
    if args.quick:
        args.size_mib, args.repeats, args.ops_mib = min(args.size_mib, 32), 1, 8
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    dp = make_batch(args.size_mib)
    nbytes = batch_bytes(dp)
    print(f"batch: {len(dp)} rows, {nbytes / 2**20:.0f} MiB of tensors")

    times = best_times(
        {
            "torch_save_roundtrip": lambda: torch_save_roundtrip(dp),
            "pickle5_buffer_callback": lambda: pickle5_oob_roundtrip(dp),
            "pickle_default_protocol": lambda: pickle_default_roundtrip(dp),
            "pickle5_in_band": lambda: pickle5_inband_roundtrip(dp),
        },
        args.repeats,
    )
    memory = {
        "torch_save_roundtrip": peak_extra_memory(lambda: torch_save_roundtrip(dp)),
        "pickle5_buffer_callback": peak_extra_memory(lambda: pickle5_oob_roundtrip(dp)),
    }

    parts = dp.chunk(8)
    chunk_s = median_time(lambda: dp.chunk(8), 200)
    keys = list(parts[0].batch.keys()) if parts[0].batch is not None else []

    def torch_cat() -> list[torch.Tensor]:
        return [torch.cat([p.batch[k] for p in parts if p.batch is not None]) for k in keys]

    cat_times = best_times(
        {"concat": lambda: DataProto.concat(parts), "torch_cat": torch_cat}, max(5, args.repeats)
    )
    concat_s, torch_cat_s = cat_times["concat"], cat_times["torch_cat"]
    joined = DataProto.concat(parts)
    assert joined.batch is not None
    assert dp.batch is not None
    assert all(torch.equal(joined.batch[k], dp.batch[k]) for k in keys)

    ops = bench_ops(dp, args.ops_mib, args.repeats)

    base = times["torch_save_roundtrip"]
    ratios = {
        "pickle5_buffer_callback_speedup": base / times["pickle5_buffer_callback"],
        "pickle_default_protocol_speedup": base / times["pickle_default_protocol"],
        "pickle5_in_band_speedup": base / times["pickle5_in_band"],
        "pickle5_buffer_callback_peak_memory_over_batch": memory["pickle5_buffer_callback"]
        / nbytes,
        "torch_save_peak_memory_over_batch": memory["torch_save_roundtrip"] / nbytes,
        "concat_over_torch_cat": concat_s / torch_cat_s,
        "index_over_torch_index_select": ops["index_over_torch"],
        "repeat2_over_torch_repeat_interleave": ops["repeat2_over_torch"],
    }
    print()
    print(f"{'operation':<34}{'seconds':>12}{'vs torch.save':>16}")
    for name, seconds in times.items():
        print(f"{name:<34}{seconds:>12.4f}{base / seconds:>15.1f}x")
    print()
    print(f"{'peak extra memory':<34}{'MiB':>12}{'x batch':>16}")
    for name, extra in memory.items():
        print(f"{name:<34}{extra / 2**20:>12.1f}{extra / nbytes:>16.3f}")
    print()
    print(f"chunk(8): {chunk_s * 1e3:.3f} ms (median of 200)")
    print(
        f"concat of 8 chunks: {concat_s:.4f} s, torch.cat of the same tensors: {torch_cat_s:.4f} s "
        f"({ratios['concat_over_torch_cat']:.2f}x)"
    )
    print(
        f"select(2 of {len(keys)} columns): {ops['select2_s'] * 1e6:.1f} us; two selects + "
        f"union: {ops['select2_union_s'] * 1e6:.1f} us (medians of 200)"
    )
    mib_ops = ops["ops_bytes"] / 2**20
    print(
        f"on {mib_ops:.0f} MiB: dp[perm of half the rows] {ops['index_s']:.4f} s, "
        f"index_select {ops['torch_index_select_s']:.4f} s ({ops['index_over_torch']:.2f}x); "
        f"repeat(2) {ops['repeat2_s']:.4f} s, repeat_interleave "
        f"{ops['torch_repeat_interleave2_s']:.4f} s ({ops['repeat2_over_torch']:.2f}x)"
    )

    result = {
        "benchmark": "sc-protocol",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "gpus": torch.cuda.device_count(),
            "memory_gib": _memory_gib(),
            "loadavg_at_end": list(os.getloadavg()),
        },
        "rows": len(dp),
        "batch_bytes": nbytes,
        "quick": args.quick,
        "seconds": {**times, "chunk8": chunk_s, "concat8": concat_s, "torch_cat8": torch_cat_s},
        "ops": ops,
        "peak_extra_memory_bytes": memory,
        "ratios": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
