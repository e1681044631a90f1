"""Rollout servers placed by Ray (``RolloutServerFleet``), the weight push
(``WeightPublisher``) and ``RouterRollout.generate_sequences``, on toy-engine servers in Ray
actors of one local cluster: the router spreads requests and keeps sessions; a server killed
mid-request is restarted through its actor and re-synced while every request is answered
once; weights are published atomically and pruned; the output batch has the rollout worker's
format."""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import ray
import safetensors.torch
import sc_trainer.rollout._publisher as publisher_module
import torch
from sc_core import ClassWithInitArgs, LocalWorkerGroup, ResourcePool
from sc_protocol import DataProto
from sc_rollout import GenerateRequest, RolloutClient, SamplingParams
from sc_rollout.routing import ServerState
from sc_rollout.serving._cli import toy_argv
from sc_rollout.testing import ToyEngineConfig
from sc_trainer.rollout import (
    RolloutFleetError,
    RolloutInputError,
    RolloutServerFleet,
    RouterRollout,
    RouterSampling,
    WeightPublisher,
    WeightPublishError,
)
from sc_workers import (
    ActorConfig,
    ActorRolloutRefConfig,
    FSDPConfig,
    ModelConfig,
    RolloutConfig,
    RolloutWorker,
)

pytestmark = pytest.mark.timeout(120)

VOCAB = 32
TOY = ToyEngineConfig(vocab_size=VOCAB, context_length=128, token_delay_s=0.01)


@pytest.fixture(scope="module")
def fleet(ray_cluster: None) -> Iterator[RolloutServerFleet]:
    with RolloutServerFleet(functools.partial(toy_argv, TOY), 3, name_prefix="toy") as fleet:
        yield fleet


def _request(prompt: tuple[int, ...], max_tokens: int = 4, **kwargs: Any) -> GenerateRequest:
    return GenerateRequest(prompt, SamplingParams(max_tokens=max_tokens, seed=0), **kwargs)


def _wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _served(fleet: RolloutServerFleet) -> dict[str, int]:
    return {s.name: s.served for s in fleet.servers()}


def _next_version(publisher: WeightPublisher) -> int:
    return 1 if publisher.version is None else publisher.version + 1


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(VOCAB, 8, generator=g), "head.bias": torch.zeros(VOCAB)}


def test_servers_run_in_ray_actors_bound_to_the_node_address(fleet: RolloutServerFleet) -> None:
    statuses = fleet.servers()
    assert [s.name for s in statuses] == ["toy-0", "toy-1", "toy-2"] == fleet.names
    assert all(s.state is ServerState.LIVE for s in statuses)
    ray_util: Any = ray.util  # loosely typed
    node_ip = ray_util.get_node_ip_address()
    assert {urlsplit(s.url).hostname for s in statuses} == {node_ip}
    pids = [fleet.server_pid(name) for name in fleet.names]
    assert all(isinstance(p, int) for p in pids)
    assert len(set(pids)) == 3
    # each server runs in a process of its own, owned by its actor, not by the driver
    assert all(RolloutClient(s.url).health().model == TOY.model for s in statuses)


def test_the_router_spreads_requests_and_sessions_stay_put(fleet: RolloutServerFleet) -> None:
    router = fleet.router
    before = _served(fleet)
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(router.generate, [_request((2, 3), 8) for _ in range(12)]))
    after = _served(fleet)
    assert sum(after.values()) - sum(before.values()) == 12
    assert {r.server for r in results} == set(fleet.names)
    sticky = [router.generate(_request((4,), session_id="agent-7")) for _ in range(5)]
    assert len({r.server for r in sticky}) == 1
    assert router.session_server("agent-7") == sticky[0].server


def test_publish_writes_atomically_prunes_and_engines_report_the_version(
    fleet: RolloutServerFleet, publisher: WeightPublisher, tmp_path: Path
) -> None:
    first = _next_version(publisher)
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        # a version directory, whenever it is visible, holds a complete weight file
        while not stop.is_set():
            for version in publisher.versions_on_disk():
                path = publisher.path_of(version) / "model.safetensors"
                try:
                    loaded = safetensors.torch.load_file(str(path))
                except FileNotFoundError:  # pruned meanwhile
                    continue
                seen.append(f"v{version}:{sorted(loaded)}")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        path = publisher.publish(first, _weights(1))
    finally:
        stop.set()
        watcher.join()
    assert path == publisher.path_of(first)
    assert path.is_dir()
    assert all(s.endswith("['embed.weight', 'head.bias']") for s in seen)
    tied = torch.randn(VOCAB, 8)
    source = tmp_path / "given.safetensors"
    safetensors.torch.save_file({"w": torch.ones(3)}, str(source))
    publisher.publish(first + 1, str(source))
    publisher.publish(first + 2, {"embed": tied, "lm_head": tied})  # shared storage
    assert publisher.versions_on_disk()[-2:] == [first + 1, first + 2]
    assert len(publisher.versions_on_disk()) == 2
    assert [p.name for p in publisher.weights_dir.iterdir() if p.name.startswith(".")] == []
    assert sorted(p.name for p in publisher.path_of(first + 1).iterdir()) == ["given.safetensors"]
    assert fleet.router.weight_version == first + 2
    for status in fleet.servers():
        assert status.weight_version == first + 2
        assert RolloutClient(status.url).health().weight_version == first + 2
    with pytest.raises(RolloutInputError, match="not above the last version published"):
        publisher.publish(first + 2, _weights(2))


def test_a_failed_write_leaves_nothing_and_pushes_nothing(
    fleet: RolloutServerFleet, publisher: WeightPublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = _next_version(publisher)
    current = fleet.router.weight_version

    def half_written(tensors: dict[str, torch.Tensor], filename: str) -> None:
        Path(filename).write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publisher_module, "save_file", half_written)
    with pytest.raises(WeightPublishError, match=f"weights version {version}"):
        publisher.publish(version, _weights(3))
    assert not publisher.path_of(version).exists()
    assert [p.name for p in publisher.weights_dir.iterdir() if p.name.startswith(".")] == []
    assert fleet.router.weight_version == current


def test_a_server_killed_mid_request_is_restarted_and_resynced(
    fleet: RolloutServerFleet, publisher: WeightPublisher
) -> None:
    version = _next_version(publisher)
    publisher.publish(version, _weights(version))
    victim = fleet.names[0]
    restarts = {s.name: s.restarts for s in fleet.servers()}
    old_pid = fleet.server_pid(victim)
    before = _served(fleet)
    requests = [_request((5, 6), 40, request_id=f"kill-{i}") for i in range(9)]
    with ThreadPoolExecutor(9) as pool:
        futures = [pool.submit(fleet.router.generate, r) for r in requests]
        _wait_until(
            lambda: {s.name: s.in_flight for s in fleet.servers()}[victim] > 0,
            "requests in flight on the victim",
        )
        fleet.kill_server(victim)
        results = [f.result(timeout=60) for f in futures]
    assert sorted(r.request_id for r in results) == sorted(r.request_id for r in requests)
    assert all(r.finish_reason == "length" and len(r.token_ids) == 40 for r in results)
    assert all(r.weight_version == version for r in results)
    _wait_until(
        lambda: (
            {s.name: s.state for s in fleet.servers()}[victim] is ServerState.LIVE
            and {s.name: s.restarts for s in fleet.servers()}[victim] == restarts[victim] + 1
        ),
        "the victim to come back",
    )
    # every request was answered once: the cut ones by another server
    assert sum(_served(fleet).values()) - sum(before.values()) == 9
    status = {s.name: s for s in fleet.servers()}[victim]
    assert status.error is not None
    new_pid = fleet.server_pid(victim)
    assert new_pid is not None
    assert new_pid != old_pid
    # re-synced to the current weights before it served again
    assert status.weight_version == version
    assert RolloutClient(status.url).health().weight_version == version
    assert fleet.router.generate(_request((2,), session_id=None)).weight_version == version


def test_a_server_that_fails_to_start_names_its_index_and_argv(ray_cluster: None) -> None:
    def failing(host: str, port: int) -> list[str]:
        return [sys.executable, "-c", f"import sys; sys.exit(3)  # {host}:{port}"]

    with pytest.raises(RolloutFleetError) as info:
        RolloutServerFleet(failing, 1, name_prefix="broken", num_cpus_per_server=0.5)
    message = str(info.value)
    assert "rollout server 0 did not start" in message
    assert "sys.exit(3)" in message
    assert "1 of 1 server(s) failed to start" in message


# --- generate_sequences: the rollout worker's batch format ------------------------------------


def _worker_config(response_length: int) -> ActorRolloutRefConfig:
    return ActorRolloutRefConfig(
        model=ModelConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            seed=7,
            eos_token_id=1,
        ),
        actor=ActorConfig(fsdp_config=FSDPConfig(param_dtype="float32")),
        rollout=RolloutConfig(response_length=response_length),
        device="cpu",
    )


def _prompt_batch(rows: int, length: int) -> DataProto:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, VOCAB, (rows, length), generator=g)
    mask = torch.ones(rows, length, dtype=torch.long)
    for row in range(rows):
        pad = row % 4
        ids[row, :pad] = 0
        mask[row, :pad] = 0
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        },
        non_tensors={"uid": np.array([f"p{i}" for i in range(rows)], dtype=object)},
        meta_info={"do_sample": False},
    )


def test_generate_sequences_builds_the_rollout_workers_batch(fleet: RolloutServerFleet) -> None:
    length = 12
    config = _worker_config(length)
    prompts = _prompt_batch(9, 6)
    group = LocalWorkerGroup(ResourcePool([1]), ClassWithInitArgs(RolloutWorker, config=config))
    try:
        group.init_model()
        expected = group.generate_sequences(prompts)
    finally:
        group.close()
    sampling = RouterSampling.from_configs(config.rollout, config.model)
    assert sampling.eos_token_ids == (1,)
    assert sampling.pad_token_id == 0
    with RouterRollout(fleet.router, sampling, max_concurrency=4, session_key="uid") as rollout:
        got = rollout.generate_sequences(prompts, batch_id="format")
    assert got.batch is not None
    assert expected.batch is not None
    assert sorted(got.batch.keys()) == sorted(expected.batch.keys())
    for key in expected.batch.keys():  # noqa: SIM118 (iterating a TensorDict gives rows)
        mine, theirs = got.batch[key], expected.batch[key]
        assert (mine.dtype, mine.shape) == (theirs.dtype, theirs.shape), key
    width = prompts.batch["input_ids"].shape[1]  # type: ignore[index]
    for column in ("prompts", "input_ids", "attention_mask", "position_ids"):
        prefix = got.batch[column][:, :width]
        assert torch.equal(prefix, expected.batch[column][:, :width]), column
    assert torch.equal(got.batch["position_ids"], expected.batch["position_ids"])
    assert sorted(got.non_tensor_batch) == ["uid", "weight_version_max", "weight_version_min"]
    assert list(got.non_tensor_batch["uid"]) == list(prompts.non_tensor_batch["uid"])
    version = fleet.router.weight_version or 0
    assert got.meta_info == {"weight_version": version}
    assert set(got.non_tensor_batch["weight_version_min"].tolist()) == {version}
    responses, mask = got.batch["responses"], got.batch["response_mask"]
    log_probs = got.batch["rollout_log_probs"]
    for row in range(len(got)):
        n = int(mask[row].sum())
        assert torch.equal(mask[row, :n], torch.ones(n, dtype=mask.dtype))  # a prefix
        assert (responses[row, n:] == 0).all()
        assert (log_probs[row, n:] == 0).all()
        assert (log_probs[row, :n] < 0).all()
        if n < length:  # ended by the eos, which is kept and masked in
            assert int(responses[row, n - 1]) == 1
        assert torch.equal(got.batch["attention_mask"][row, -length:], mask[row])
        # rows in input order: the greedy completion of the row's own prompt
        prompt = prompts.batch["input_ids"][row][prompts.batch["attention_mask"][row].bool()]  # type: ignore[index]
        alone = fleet.router.generate(
            GenerateRequest(
                tuple(prompt.tolist()),
                SamplingParams(max_tokens=length, temperature=0.0, stop_token_ids=(1,)),
            )
        )
        assert responses[row, :n].tolist() == list(alone.token_ids)
