"""Checkpoints: save -> load -> the next update equals the run that never stopped."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from _workers_helpers import (
    PROMPT_LEN,
    actor_config,
    col,
    critic_config,
    full_weights,
    make_tensors,
    proto,
)
from sc_protocol import DataProto
from sc_workers import (
    ActorRolloutRefConfig,
    ActorRolloutRefWorker,
    CheckpointError,
    ConfigError,
    CriticWorker,
    NotInitializedError,
)


@pytest.fixture(autouse=True)
def _single_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")


def _config() -> ActorRolloutRefConfig:
    """Shuffled mini-batches and a 3-step warmup: resuming needs the counters and schedule."""
    cfg = actor_config(shuffle=True)
    optim = dataclasses.replace(cfg.actor.optim, lr_warmup_steps=3)
    return dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, optim=optim))


def _prompts() -> DataProto:
    t = make_tensors(4, seed=5)
    mask = t["attention_mask"][:, :PROMPT_LEN]
    return proto(
        {
            "input_ids": t["prompts"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )


def _batch(seed: int) -> DataProto:
    return proto(make_tensors(8, seed=seed), temperature=1.0)


def _finish(
    w: ActorRolloutRefWorker,
) -> tuple[dict[str, float], dict[str, torch.Tensor], torch.Tensor]:
    metrics = w.update_actor(_batch(2)).meta_info["metrics"]
    weights = full_weights(w.actor_engine)
    gen = col(w.generate_sequences(_prompts()), "responses")
    return metrics, weights, gen


def test_actor_resume_is_exact(tmp_path: Path) -> None:
    path = str(tmp_path / "actor")
    a = ActorRolloutRefWorker(_config(), "actor_rollout")
    a.init_model()
    a.update_actor(_batch(1))
    a.generate_sequences(_prompts())  # advances the sampler's generator
    a.save_checkpoint(path, global_step=1)
    expected = _finish(a)

    torch.manual_seed(12345)  # the global RNG state is restored from the checkpoint too
    b = ActorRolloutRefWorker(_config(), "actor_rollout")
    b.init_model()
    b.load_checkpoint(path)
    got = _finish(b)

    assert got[0] == expected[0]
    assert got[0]["actor/lr"] == pytest.approx(1e-2 * 2 / 3)  # second warmup step
    for name, tensor in expected[1].items():
        assert torch.equal(got[1][name], tensor), name
    assert torch.equal(got[2], expected[2])

    # without the checkpoint the next update differs (the test can fail)
    c = ActorRolloutRefWorker(_config(), "actor_rollout")
    c.init_model()
    assert c.update_actor(_batch(2)).meta_info["metrics"] != expected[0]


def test_critic_resume_is_exact(tmp_path: Path) -> None:
    path = str(tmp_path / "critic")
    a = CriticWorker(critic_config())
    a.init_model()
    a.update_critic(_batch(1))
    a.save_checkpoint(path, global_step=1)
    expected = a.update_critic(_batch(2)).meta_info["metrics"]
    weights = full_weights(a.critic_engine)
    b = CriticWorker(critic_config())
    b.init_model()
    b.load_checkpoint(path)
    assert b.update_critic(_batch(2)).meta_info["metrics"] == expected
    for name, tensor in full_weights(b.critic_engine).items():
        assert torch.equal(tensor, weights[name]), name


def test_layout_and_files(tmp_path: Path) -> None:
    w = CriticWorker(critic_config())
    w.init_model()
    path = tmp_path / "ckpt"
    path.mkdir()
    stale = path / "v000007.tmp"  # left by a crashed save
    stale.mkdir()
    (stale / "garbage").write_text("left by a crashed save")
    w.save_checkpoint(str(path), global_step=3)
    assert sorted(p.name for p in path.iterdir()) == ["CURRENT", "v000001"]
    assert (path / "CURRENT").read_text() == "v000001"
    version = path / "v000001"
    assert sorted(p.name for p in version.iterdir()) == ["meta.json", "rank_00000_of_00001.pt"]
    assert not stale.exists()
    meta = json.loads((version / "meta.json").read_text())
    assert meta["global_step"] == 3
    assert (meta["world_size"], meta["dp_size"], meta["tp_size"]) == (1, 1, 1)
    w.save_checkpoint(str(path), global_step=4)  # overwriting publishes a new version
    assert sorted(p.name for p in path.iterdir()) == ["CURRENT", "v000002"]
    assert json.loads((path / "v000002" / "meta.json").read_text())["global_step"] == 4


def test_max_ckpt_to_keep(tmp_path: Path) -> None:
    w = CriticWorker(critic_config())
    w.init_model()
    for step in (1, 2, 3):
        w.save_checkpoint(str(tmp_path / f"step{step}"), global_step=step, max_ckpt_to_keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step2", "step3"]
    with pytest.raises(ConfigError, match="max_ckpt_to_keep must be >= 1, got 0"):
        w.save_checkpoint(str(tmp_path / "x"), max_ckpt_to_keep=0)


def test_checkpoint_errors(tmp_path: Path) -> None:
    w = CriticWorker(critic_config())
    w.init_model()
    with pytest.raises(CheckpointError, match="is not a directory"):
        w.load_checkpoint(str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"holds no complete checkpoint"):
        w.load_checkpoint(str(tmp_path / "empty"))
    path = tmp_path / "ckpt"
    w.save_checkpoint(str(path))
    meta_file = path / "v000001" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta.update(world_size=4, dp_size=2, tp_size=2)
    meta_file.write_text(json.dumps(meta))
    # another layout loads by resharding, which needs every rank's file
    with pytest.raises(CheckpointError, match=r"rank_00000_of_00004\.pt does not exist"):
        w.load_checkpoint(str(path))
    meta_file.write_text(json.dumps({**meta, "format": 1}))  # sc-workers 0.2: no resharding
    with pytest.raises(
        CheckpointError,
        match=r"world size 4 \(dp 2, tp 2\) and other blocks than this group's, world size 1 "
        r"\(dp 1, tp 1\); its format 1 does not name the optimizer's parameters",
    ):
        w.load_checkpoint(str(path))
    w.save_checkpoint(str(path))
    (path / "v000002" / "rank_00000_of_00001.pt").unlink()
    with pytest.raises(CheckpointError, match=r"rank_00000_of_00001\.pt does not exist"):
        w.load_checkpoint(str(path))
    with pytest.raises(ConfigError, match="hdfs_path 'hdfs://x' is not supported"):
        w.save_checkpoint(str(path), hdfs_path="hdfs://x")
    rollout = ActorRolloutRefWorker(actor_config(), "rollout")
    with pytest.raises(NotInitializedError, match="role 'rollout' has no actor"):
        rollout.save_checkpoint(str(path))


def test_checkpoint_of_another_model_is_rejected(tmp_path: Path) -> None:
    small = CriticWorker(critic_config())
    small.init_model()
    small.save_checkpoint(str(tmp_path / "c"))
    cfg = critic_config()
    bigger = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hidden_size=64))
    other = CriticWorker(bigger)
    other.init_model()
    with pytest.raises(CheckpointError, match=r"embed_tokens.weight has local shape \(32, 32\)"):
        other.load_checkpoint(str(tmp_path / "c"))


# --------------------------------------------------------------- background saves


def test_a_background_save_holds_the_state_of_when_it_was_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CPU engine's background save writes the live tensors: the next update must wait
    until they are written. The write is held back 0.5 s; an update that did not wait would
    change the weights under it, and the checkpoint would hold the later state."""
    import time

    real_save = torch.save

    def slow_save(obj: object, f: object) -> None:
        time.sleep(0.5)
        real_save(obj, f)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "save", slow_save)
    path = str(tmp_path / "actor")
    a = ActorRolloutRefWorker(_config(), "actor_rollout")
    a.init_model()
    a.update_actor(_batch(1))
    a.generate_sequences(_prompts())
    a.save_checkpoint(path, global_step=1, background=True)
    assert a.wait_checkpoint(timeout=0) is False  # the thread is still writing
    expected = _finish(a)  # the update inside waits for the write
    assert a.wait_checkpoint() is True
    monkeypatch.setattr(torch, "save", real_save)
    assert a.wait_checkpoint(timeout=0) is True  # nothing pending any more
    assert (
        json.loads((tmp_path / "actor" / "v000001" / "meta.json").read_text())["global_step"] == 1
    )

    b = ActorRolloutRefWorker(_config(), "actor_rollout")
    b.init_model()
    b.load_checkpoint(path)
    got = _finish(b)
    assert got[0] == expected[0]
    for name, tensor in expected[1].items():
        assert torch.equal(got[1][name], tensor), name
    assert torch.equal(got[2], expected[2])


def test_the_next_save_and_a_load_wait_for_a_background_save(tmp_path: Path) -> None:
    w = CriticWorker(critic_config())
    w.init_model()
    path = tmp_path / "ckpt"
    w.save_checkpoint(str(path), global_step=1, background=True)
    w.save_checkpoint(str(path), global_step=2, background=True)  # waits for the first
    w.load_checkpoint(str(path))  # waits for the second
    assert (path / "CURRENT").read_text() == "v000002"
    assert json.loads((path / "v000002" / "meta.json").read_text())["global_step"] == 2


def test_a_failed_background_save_is_reported_and_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = CriticWorker(critic_config())
    w.init_model()
    path = tmp_path / "ckpt"
    w.save_checkpoint(str(path), global_step=1)
    real_save = torch.save

    def full_disk(obj: object, f: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    w.save_checkpoint(str(path), global_step=2, background=True)
    with pytest.raises(CheckpointError, match=r"rank 0.*step 2 failed: OSError.*No space"):
        w.wait_checkpoint()
    assert w.wait_checkpoint() is True  # reported once
    assert (path / "CURRENT").read_text() == "v000001"  # the previous version stays
    monkeypatch.setattr(torch, "save", real_save)
    w.save_checkpoint(str(path), global_step=3)  # the next save clears the dead one's .tmp
    assert sorted(p.name for p in path.iterdir()) == ["CURRENT", "v000002"]
    assert json.loads((path / "v000002" / "meta.json").read_text())["global_step"] == 3


def test_wait_checkpoint_arguments(tmp_path: Path) -> None:
    w = CriticWorker(critic_config())
    w.init_model()
    assert w.wait_checkpoint() is True  # no save pending
    for bad in (-1, "1"):
        with pytest.raises(ConfigError, match=r"wait_checkpoint \(rank 0\): timeout"):
            w.wait_checkpoint(timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="background must be a bool"):
        w.save_checkpoint(str(tmp_path / "x"), background="yes")  # type: ignore[arg-type]


def test_rank_zero_waits_for_every_file_then_times_out_or_stops(tmp_path: Path) -> None:
    import threading

    from sc_workers.workers._checkpoint_background import _SaveCancelled, wait_for_files

    cancel = threading.Event()
    late = threading.Timer(0.1, (tmp_path / "b").write_text, ("x",))
    late.start()
    (tmp_path / "a").write_text("x")
    wait_for_files(tmp_path, {"a", "b"}, 10.0, cancel, "here")  # returns once b appears
    with pytest.raises(CheckpointError, match=r"here: .* still lacks \['c'\] after 0.05 s"):
        wait_for_files(tmp_path, {"a", "c"}, 0.05, cancel, "here")
    cancel.set()
    with pytest.raises(_SaveCancelled, match="here"):
        wait_for_files(tmp_path, {"c"}, 10.0, cancel, "here")
