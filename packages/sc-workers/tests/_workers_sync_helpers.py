"""The ranks of the cross-process weight-sync tests (started by test_workers_sync_gloo.py;
a module of its own so that the forked ranks can import the job by name)."""

from __future__ import annotations

import pickle
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from _workers_helpers import tiny_model


def _trainer_model(dp: int, tp: int, rank: int) -> torch.nn.Module:
    from sc_workers import TinyCausalLM
    from sc_workers.engine import tensor_parallel_plan
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(7)
    model = TinyCausalLM(tiny_model())
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    if tp > 1:
        parallelize_module(model, mesh["tp"], tensor_parallel_plan())
    if dp > 1:
        for layer in model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    return model


def _rollout_model(tp: int, replicas: int) -> torch.nn.Module:
    from sc_workers import TinyCausalLM
    from sc_workers.engine import tensor_parallel_plan
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(99)  # not the trainer's weights
    model = TinyCausalLM(tiny_model())
    if tp > 1:
        mesh = init_device_mesh("cpu", (replicas, tp), mesh_dim_names=("replica", "tp"))
        parallelize_module(model, mesh["tp"], tensor_parallel_plan())
    return model


def sync_job(
    src: tuple[int, int],
    dst: tuple[int, int],
    ports: tuple[int, int, int, int],
    rank: int,
    out: str,
) -> None:
    """Channel rank ``rank``: a trainer rank (dp x tp = src) or a rollout rank (tp x replicas)."""
    import torch.distributed as dist
    from sc_workers.sync import (
        ChannelSpec,
        ModelLayout,
        build_plan,
        held_tensors,
        module_regions,
        open_channel,
        receive_weights,
        send_weights,
    )
    from sc_workers.sync._layout import local_view

    torch.set_num_threads(1)
    n_src = src[0] * src[1]
    n_dst = dst[0] * dst[1]
    trainer = rank < n_src
    world_rank = rank if trainer else rank - n_src
    world = n_src if trainer else n_dst
    port = ports[0] if trainer else ports[1]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=world_rank, world_size=world
    )
    model = _trainer_model(*src, world_rank) if trainer else _rollout_model(*dst)
    # the controller's part: gather every rank's regions (here through a store)
    c10d: Any = dist  # the store class is public but not exported in torch's stubs
    store = c10d.TCPStore(
        "127.0.0.1", ports[2], n_src + n_dst, is_master=rank == 0, timeout=timedelta(seconds=120)
    )
    store.set(f"report{rank}", pickle.dumps(module_regions(model)))
    reports = [pickle.loads(store.get(f"report{r}")) for r in range(n_src + n_dst)]
    source = ModelLayout.from_ranks(reports[:n_src])
    destination = ModelLayout.from_ranks(reports[n_src:])
    plan = build_plan(source, destination)
    channel = open_channel(ChannelSpec("gloo", "sync-test", n_src + n_dst, port=ports[3]), rank)
    result: dict[str, Any] = {}
    if trainer:
        result["sent"] = send_weights(
            channel, plan, world_rank, held_tensors(model, source.ranks[world_rank])
        ).wire_bytes
        full = {
            n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()
        }
        result["full"] = full
    else:
        regions = destination.ranks[world_rank]
        staged = receive_weights(channel, plan, world_rank, held_tensors(model, regions), 1).staged
        staged.commit()
        result["received"] = staged.bytes_received
        result["expected_bytes"] = sum(r.numel * 4 for r in regions.values())
        result["local"] = {
            n: (local_view(p).detach().clone(), regions[n]) for n, p in model.named_parameters()
        }
    torch.save(result, Path(out) / f"rank{rank}.pt")
    store.set(f"done{rank}", "1")
    for r in range(n_src + n_dst):
        store.get(f"done{r}")  # keep the store's host alive until everyone is done
    channel.close()
    dist.destroy_process_group()
