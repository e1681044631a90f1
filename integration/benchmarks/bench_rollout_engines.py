"""The rollout engines side by side: generation speed, weight push time, router overhead.

    uv run python integration/benchmarks/bench_rollout_engines.py   # results/rollout_engines.json

One model (a GPT-2 built here, ``--hidden`` wide, ``--layers`` deep, heads of 32, float32)
served twice, each server a process of its own: by vLLM (``python -m sc_rollout vllm``, in
the vLLM environment, which this script makes if it is missing) and by sc-workers' built-in
engine (``python -m sc_workers.rollout``). Recorded, every figure of one run:

* generation: ``--batch`` requests at once (``--max-tokens`` sampled tokens each, stop
  tokens off, so every request makes them all) through a ``RolloutClient`` per engine, the
  engines taking turns round by round; tokens per second of each and their ratio (vLLM over
  built-in). Also the trainer's own sampler (sc-workers' ``generate`` on the same batch in
  this process, no server), for scale;
* weight push: the trainer's export (``save_hf_model``: a safetensors directory, written
  atomically) plus the engine's ``load_weights`` (read, check, reload), against writing and
  reading the same bytes with safetensors alone; the ratio is the push's cost over plain IO;
* router: one request of one token at a time, through a ``Router`` over the vLLM server and
  to the server directly, alternating; the ratio of the medians and their difference.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from _machine import machine, write_result  # this folder: the script's own
from safetensors.torch import load_file, save_file
from sc_rollout import (
    GenerateRequest,
    RolloutClient,
    Router,
    SamplingParams,
    ServerProcess,
    VLLMEngineConfig,
    WeightUpdate,
)
from sc_rollout.engines import create_vllm_env
from sc_trainer.tasks import save_tiny_gpt2
from sc_workers.models import load_hf_model, save_hf_model
from sc_workers.rollout import TorchRolloutEngineConfig, torch_engine_argv


def _requests(batch: int, max_tokens: int, round_: int) -> list[GenerateRequest]:
    return [
        GenerateRequest(
            prompt_ids=[2, *(3 + (i + j) % 10 for j in range(7))],
            sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=round_ * 1000 + i),
        )
        for i in range(batch)
    ]


def _generate_round(client: RolloutClient, requests: list[GenerateRequest]) -> tuple[float, int]:
    started = time.perf_counter()
    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(client.generate, requests))
    seconds = time.perf_counter() - started
    return seconds, sum(len(r.token_ids) for r in results)


def generation(
    clients: dict[str, RolloutClient], batch: int, max_tokens: int, rounds: int
) -> dict[str, Any]:
    for client in clients.values():  # warm-up
        _generate_round(client, _requests(batch, max_tokens, 999))
    seconds: dict[str, list[float]] = {name: [] for name in clients}
    tokens: dict[str, int] = dict.fromkeys(clients, 0)
    for r in range(rounds):
        for name, client in clients.items():
            s, n = _generate_round(client, _requests(batch, max_tokens, r))
            seconds[name].append(s)
            tokens[name] += n
    rates = {name: tokens[name] / sum(seconds[name]) for name in clients}
    return {
        "batch": batch,
        "max_tokens": max_tokens,
        "rounds": rounds,
        "tokens_per_s": rates,
        "seconds_per_round": {name: statistics.median(s) for name, s in seconds.items()},
        "ratio_vllm_over_builtin": rates["vllm"] / rates["builtin"],
    }


def trainer_sampler(model_dir: str, batch: int, max_tokens: int, rounds: int) -> dict[str, Any]:
    """sc-workers' batched ``generate`` (the worker rollout's sampler) on the same batch."""
    from sc_workers.workers._sampling import SamplingParams as WorkerSampling
    from sc_workers.workers._sampling import generate

    model = load_hf_model(model_dir, value_head=False, dtype=torch.float32).eval()

    class _Engine:  # the slice of sc-workers' Engine that generate() uses
        device = torch.device("cpu")
        step_group = None

        def new_cache(self) -> Any:
            return model.new_cache()

        def forward(self, ids: Any, mask: Any, pos: Any, cache: Any = None) -> Any:
            return model(ids, mask, pos, cache)

    ids = torch.tensor([r.prompt_ids for r in _requests(batch, max_tokens, 0)])
    mask, pos = torch.ones_like(ids), torch.arange(ids.shape[1]).expand_as(ids)
    params = WorkerSampling(max_tokens, 1.0, 0, 1.0, True, (), 0)
    gen = torch.Generator().manual_seed(0)
    generate(_Engine(), ids, mask, pos, params, gen)  # type: ignore[arg-type]
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        generate(_Engine(), ids, mask, pos, params, gen)  # type: ignore[arg-type]
        times.append(time.perf_counter() - t0)
    return {"tokens_per_s": batch * max_tokens * rounds / sum(times)}


def weight_push(
    clients: dict[str, RolloutClient], model_dir: str, work: Path, rounds: int
) -> dict[str, Any]:
    model = load_hf_model(model_dir, value_head=False, dtype=torch.float32)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    nbytes = sum(v.numel() * v.element_size() for k, v in state.items() if "lm_head" not in k)
    out: dict[str, Any] = {"bytes": nbytes}
    plain: list[float] = []
    hf = {k.removeprefix("model."): v.contiguous() for k, v in state.items()}
    hf.pop("lm_head.weight", None)
    version = max(c.weight_version() for c in clients.values())
    pushes: dict[str, list[float]] = {name: [] for name in clients}
    for r in range(rounds):
        t0 = time.perf_counter()
        save_file(hf, str(work / f"plain{r}.safetensors"))
        load_file(str(work / f"plain{r}.safetensors"))
        plain.append(time.perf_counter() - t0)
        version += 1
        for name, client in clients.items():
            t0 = time.perf_counter()
            folder = work / f"{name}-v{version}"
            save_hf_model(state, "causal_lm", model_dir, folder)
            client.load_weights(WeightUpdate(version=version, path=str(folder)))
            pushes[name].append(time.perf_counter() - t0)
    out["write_and_read_s"] = statistics.median(plain)
    for name, times in pushes.items():
        out[f"push_s_{name}"] = statistics.median(times)
        out[f"ratio_push_over_io_{name}"] = statistics.median(times) / statistics.median(plain)
    return out


def router_overhead(url: str, calls: int) -> dict[str, Any]:
    client = RolloutClient(url)
    request = GenerateRequest([2, 3, 4], SamplingParams(max_tokens=1, temperature=0.0))
    direct: list[float] = []
    routed: list[float] = []
    with Router([url]) as router:
        for _ in range(10):
            client.generate(request)
            router.generate(request)
        for _ in range(calls):
            t0 = time.perf_counter()
            client.generate(request)
            t1 = time.perf_counter()
            router.generate(request)
            t2 = time.perf_counter()
            direct.append(t1 - t0)
            routed.append(t2 - t1)
    d, r = statistics.median(direct), statistics.median(routed)
    return {
        "calls": calls,
        "direct_s": d,
        "routed_s": r,
        "ratio_routed_over_direct": r / d,
        "added_us": (r - d) * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path("integration/benchmarks/results/rollout_engines.json")
    )
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="batch 8, 16 tokens, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.max_tokens, args.rounds, args.calls = 8, 16, 2, 30
    create_vllm_env()
    work = Path(tempfile.mkdtemp(prefix="sc-bench-engines-"))
    model_dir = save_tiny_gpt2(
        work / "gpt2",
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.hidden // 32,
        context=128,
    )
    vllm = ServerProcess.vllm(VLLMEngineConfig(model=model_dir, max_num_seqs=args.batch))
    builtin = ServerProcess(
        torch_engine_argv(TorchRolloutEngineConfig(model=model_dir, max_batch_size=args.batch)),
        start_timeout_s=300,
    )
    try:
        clients = {"vllm": RolloutClient(vllm.url), "builtin": RolloutClient(builtin.url)}
        gen = generation(clients, args.batch, args.max_tokens, args.rounds)
        gen["trainer_sampler_in_process"] = trainer_sampler(
            model_dir, args.batch, args.max_tokens, args.rounds
        )
        push = weight_push(clients, model_dir, work, args.rounds)
        route = router_overhead(vllm.url, args.calls)
    finally:
        vllm.stop(30)
        builtin.stop()
    out = {
        "benchmark": "rollout engines: vLLM against the built-in engine on one model",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(torch=torch.__version__),
        "quick": args.quick,
        "model": {"hidden": args.hidden, "layers": args.layers, "heads": args.hidden // 32},
        "generation": gen,
        "weight_push": push,
        "router": route,
    }
    print(json.dumps({"generation": gen, "weight_push": push, "router": route}, indent=2))
    write_result(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
