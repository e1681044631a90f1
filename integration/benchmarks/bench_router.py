"""The router's added latency per request, against calling the server directly.

    uv run python integration/benchmarks/bench_router.py     # results/router.json

One toy-engine server in a process of its own (``python -m sc_rollout toy``, no delay per
token), and one request at a time of ``--max-tokens`` (1) tokens: through a
``RolloutClient`` (direct: one HTTP call) and through a ``Router`` over that server (its
choice of server, its in-flight bookkeeping, then the same client call). The two alternate
call by call (``--rounds`` x ``--calls`` pairs), so that load on the machine falls on both
alike. Recorded: the median latency of each, their ratio (routed over direct), the
difference of the medians and the median of the paired differences, in microseconds (the
router's own cost per request).

A second figure puts ``--threads`` callers on ``--servers`` servers at once, through the
router and directly (each caller pinned to one server, round-robin), and records the time
per request of each: what the router's lock and choice cost under concurrency.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _machine import machine, write_result  # this folder: the script's own
from sc_rollout import (
    GenerateRequest,
    GenerateResult,
    RolloutClient,
    Router,
    SamplingParams,
    ServerProcess,
)


def _request(max_tokens: int) -> GenerateRequest:
    return GenerateRequest((1, 2, 3), SamplingParams(max_tokens=max_tokens, seed=0))


def _timed(call: Callable[[GenerateRequest], GenerateResult], tokens: int) -> float:
    req = _request(tokens)
    t0 = time.perf_counter()
    call(req)
    return time.perf_counter() - t0


def sequential(url: str, calls: int, rounds: int, tokens: int) -> dict[str, Any]:
    client = RolloutClient(url)
    direct: list[float] = []
    routed: list[float] = []
    with Router([url]) as router:
        for _ in range(20):  # warm-up
            _timed(client.generate, tokens)
            _timed(router.generate, tokens)
        for index in range(calls * rounds):
            # alternate call by call (which goes first alternates too): both see the same load
            pair = (client.generate, router.generate)
            first, second = pair if index % 2 == 0 else pair[::-1]
            a, b = _timed(first, tokens), _timed(second, tokens)
            d, r = (a, b) if index % 2 == 0 else (b, a)
            direct.append(d)
            routed.append(r)
    d, r = statistics.median(direct), statistics.median(routed)
    return {
        "calls": calls * rounds,
        "direct_median_s": d,
        "routed_median_s": r,
        "ratio_routed_over_direct": r / d,
        "router_added_us": (r - d) * 1e6,
        "paired_difference_median_us": statistics.median(
            (x - y) * 1e6 for x, y in zip(routed, direct, strict=True)
        ),
        "direct_p90_s": statistics.quantiles(direct, n=10)[-1],
        "routed_p90_s": statistics.quantiles(routed, n=10)[-1],
    }


def concurrent(urls: list[str], threads: int, calls: int, tokens: int) -> dict[str, Any]:
    clients = [RolloutClient(u) for u in urls]

    def per_request(call: Callable[[int], object]) -> float:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(call, range(threads * 5)))  # warm-up
            t0 = time.perf_counter()
            list(pool.map(call, range(calls)))
            return (time.perf_counter() - t0) / calls

    with Router(urls) as router:
        direct = per_request(lambda i: clients[i % len(clients)].generate(_request(tokens)))
        routed = per_request(lambda i: router.generate(_request(tokens)))
    return {
        "servers": len(urls),
        "threads": threads,
        "calls": calls,
        "direct_s_per_request": direct,
        "routed_s_per_request": routed,
        "ratio_routed_over_direct": routed / direct,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path("integration/benchmarks/results/router.json")
    )
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="100 calls, 3 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.rounds = 100, 3
    processes = [ServerProcess.toy(start_timeout_s=60) for _ in range(max(1, args.servers))]
    try:
        urls = [p.url for p in processes]
        seq = sequential(urls[0], args.calls, args.rounds, args.max_tokens)
        conc = concurrent(urls, args.threads, args.calls * 2, args.max_tokens)
    finally:
        for process in processes:
            process.stop()
    out = {
        "benchmark": "router's added latency per request against the server called directly",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "quick": args.quick,
        "max_tokens": args.max_tokens,
        "sequential": seq,
        "concurrent": conc,
    }
    print(json.dumps({"sequential": seq, "concurrent": conc}, indent=2), flush=True)
    write_result(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
