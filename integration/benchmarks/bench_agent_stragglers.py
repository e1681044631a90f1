"""Batch time of multi-turn agent sessions with slow agents, waiting for all against streaming.

    uv run python integration/benchmarks/bench_agent_stragglers.py   # results/agent_stragglers.json

A batch is ``--groups`` prompt groups of ``--n`` agent sessions (an ``AgentLoop`` over a
``Router`` of ``--servers`` toy-engine servers, each in a process of its own, ``--delay-ms``
per token). Each session is two model turns of ``--tokens`` tokens around one tool call of
``--tool-ms``; in the slow case ``--slow`` (10 %) of the groups call a tool ``--factor``
(5) times slower. Three ways to make the batch, all measured in one run, round after round
(alternating, so that load on the machine falls on all alike):

* ``none``: no slow agents, the batch waits for every session (the baseline);
* ``wait_all``: 10 % slow agents, the batch waits for every session;
* ``streaming``: 10 % slow agents, ``--extra`` more groups running than the batch needs,
  the batch takes the first groups to finish and the rest are discarded.

Recorded: the median batch time of each and its ratio to ``none``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import time
from pathlib import Path
from typing import Any

from _machine import machine, write_result  # this folder: the script's own
from sc_rollout import (
    AgentLoop,
    AgentLoopConfig,
    AgentSession,
    AgentTask,
    Router,
    SamplingParams,
    ServerProcess,
)
from sc_rollout.testing import ToyEngineConfig


def _agent(tokens: int) -> Any:
    async def agent(task: AgentTask, session: AgentSession) -> float:
        await session.agenerate(max_tokens=tokens)
        await asyncio.sleep(float(task.data))  # the tool
        session.append_tokens((1, 2, 3))
        await session.agenerate(max_tokens=tokens)
        return 1.0

    return agent


def _tasks(args: argparse.Namespace, groups: int, slow: int, tag: str) -> list[AgentTask]:
    tool = args.tool_ms / 1000
    return [
        AgentTask(
            (1, 2, 3, 4),
            f"{tag}-{g}",
            data=tool * args.factor if g < slow else tool,
            session_id=f"{tag}-{g}-{k}",
        )
        for g in range(groups)
        for k in range(args.n)
    ]


def one_batch(loop: AgentLoop, args: argparse.Namespace, case: str, tag: str) -> float:
    """Seconds to a batch of ``args.groups`` groups, made as ``case`` says."""
    slow = 0 if case == "none" else round(args.slow * args.groups)
    extra = args.extra if case == "streaming" else 0
    # the slow groups are spread over the submission order, not all first
    tasks = _tasks(args, args.groups + extra, slow, tag)
    started = time.perf_counter()
    loop.submit(tasks)
    loop.take_groups(args.groups, timeout=300)
    seconds = time.perf_counter() - started
    loop.discard(timeout=60)  # the groups left over, cancelled (not timed)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=2.0)
    parser.add_argument("--tool-ms", type=float, default=200.0)
    parser.add_argument("--slow", type=float, default=0.1)
    parser.add_argument("--factor", type=float, default=5.0)
    parser.add_argument("--extra", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "agent_stragglers.json",
    )
    args = parser.parse_args()
    config = ToyEngineConfig(token_delay_s=args.delay_ms / 1000)
    processes = [ServerProcess.toy(config, start_timeout_s=60) for _ in range(args.servers)]
    cases = ("none", "wait_all", "streaming")
    times: dict[str, list[float]] = {case: [] for case in cases}
    try:
        sampling = SamplingParams(max_tokens=args.tokens, seed=0)
        with Router([p.url for p in processes]) as router:
            loop_config = AgentLoopConfig(args.concurrency, 120.0, sampling)
            with AgentLoop(router, _agent(args.tokens), config=loop_config) as loop:
                one_batch(loop, args, "none", "warmup")
                for r in range(args.rounds):
                    for case in cases:
                        times[case].append(one_batch(loop, args, case, f"{case}{r}"))
                        print(f"round {r} {case}: {times[case][-1]:.3f} s")
    finally:
        for process in processes:
            process.stop()
    median = {case: statistics.median(values) for case, values in times.items()}
    result = {
        "benchmark": "agent batch time with 10% slow agents: waiting for all vs streaming",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "seconds": times,
        "median_s": median,
        "ratio_to_none": {case: median[case] / median["none"] for case in cases},
    }
    print({case: round(v, 2) for case, v in result["ratio_to_none"].items()})
    write_result(args.out, result)


if __name__ == "__main__":
    main()
