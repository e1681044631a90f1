"""Replacing a dead rank on Ray: how long until the group answers calls again.

    uv run python integration/benchmarks/bench_recovery.py     # results/recovery.json

A group of ``--workers`` sc-workers ``RolloutWorker``-sized processes would need a model; this
measures the framework's part with a plain worker whose module imports torch (as sc-workers'
modules do; a spare has imported it before it takes over):

* ``start_s``: creating the group (every actor started, constructors done), per worker count;
* ``replace_s``: one rank killed (``ray.kill``), found dead by a call, then
  ``replace_ranks()`` until it returns (a new actor on the same bundle, its constructor, the
  re-form hook on every rank); ``first_call_s``: the next call on the whole group after it;
* ``spawn_s``: starting one actor process alone (a group of one), the "worker start-up" the
  replacement pays;
* ``total_s``: from the kill to the first call that succeeds again (the failed call that
  finds the death, ``replace_ranks``, the next call);
* ``standby_*``: the same with a hot standby (``RayWorkerGroup(standby=1)``, its spare
  started): the spare becomes the rank, no process starts.

The issue's goals: the call path works again in under 2 s plus one worker start-up, and in
under 2 s in total with a hot standby.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import ray
import torch  # at module level, as sc-workers' workers import it: a spare has it loaded
from _machine import local_ray, write_measurement  # this folder: the script's own
from sc_core import Worker, WorkerDiedError
from sc_dispatch import Dispatch, register
from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup


class Member(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.device = torch.device("cpu")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


def _group(workers: int, prefix: str, standby: int = 0) -> RayWorkerGroup:
    pool = RayResourcePool([workers], use_gpu=False, max_colocate_count=1)
    return RayWorkerGroup(pool, RayClassWithInitArgs(Member), name_prefix=prefix, standby=standby)


def _kill_and_recover(wg: RayWorkerGroup, rank: int) -> tuple[float, float, float]:
    """Kill ``rank``, then call until the group answers again: (replace_s, first_call_s,
    total_s from the kill)."""
    ray.kill(wg.workers[rank], no_restart=True)
    killed = time.perf_counter()
    while True:  # ray.kill returns before the actor is gone: call until the death shows
        try:
            wg.ping()
        except WorkerDiedError:
            break
        time.sleep(0.01)
    t0 = time.perf_counter()
    wg.replace_ranks()
    replaced = time.perf_counter()
    wg.ping()
    done = time.perf_counter()
    return replaced - t0, done - replaced, done - killed


def measure(workers: int, repeat: int) -> dict[str, Any]:
    spawn, start, replace, first, total = [], [], [], [], []
    hot_replace, hot_first, hot_total = [], [], []
    for i in range(repeat):
        t0 = time.perf_counter()
        with _group(1, f"spawn{i}_") as one:
            one.ping()
            spawn.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with _group(workers, f"bench{i}_") as wg:
            wg.ping()
            start.append(time.perf_counter() - t0)
            r, f, t = _kill_and_recover(wg, workers - 1)
            replace.append(r)
            first.append(f)
            total.append(t)
        with _group(workers, f"hot{i}_", standby=1) as wg:
            wg.ping()
            wg.wait_for_standby()
            r, f, t = _kill_and_recover(wg, workers - 1)
            hot_replace.append(r)
            hot_first.append(f)
            hot_total.append(t)
    med = statistics.median
    return {
        "workers": workers,
        "repeat": repeat,
        "spawn_s": med(spawn),
        "start_s": med(start),
        "replace_s": med(replace),
        "first_call_s": med(first),
        "total_s": med(total),
        "total_minus_spawn_s": med(total) - med(spawn),
        "standby_replace_s": med(hot_replace),
        "standby_first_call_s": med(hot_first),
        "standby_total_s": med(hot_total),
        "samples": {
            "spawn": spawn,
            "start": start,
            "replace": replace,
            "first_call": first,
            "total": total,
            "standby_replace": hot_replace,
            "standby_first_call": hot_first,
            "standby_total": hot_total,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path("integration/benchmarks/results/recovery.json")
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 workers, one repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.repeat = 2, 1
    with local_ray(max(8, args.workers + 1)):
        result = measure(args.workers, args.repeat)
    write_measurement(
        args.out, "replace a dead rank on Ray", result, quick=args.quick, ray=ray.__version__
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
