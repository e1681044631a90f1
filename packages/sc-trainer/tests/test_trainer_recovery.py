"""Recovery in place (``TrainerConfig.inject_fault``, ``max_recoveries``), in-process: a rank
killed when a step begins or inside a method is replaced, every role goes back to the newest
checkpoint, and the run ends with weights bit-identical to an uninterrupted run; the
checkpoints it relies on. The Ray cases are the fault matrix
(``test_integration_fault_matrix.py``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from _trainer_runs import deterministic, run, tiny_config
from sc_core import InjectedFaultError, SpanRecorder, WorkerError
from sc_trainer import TrainerConfigError
from sc_trainer.faults import FaultSpec, Recovery, TrainerRecoveryError, lost_peer
from sc_trainer.runs import read_metrics
from sc_workers import published_step

pytestmark = pytest.mark.timeout(300)


def _weights(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Every rank file's model tensors under a checkpoint folder."""
    out = {}
    for path in sorted(folder.rglob("*.pt")):
        state = torch.load(path, weights_only=False)
        model = state.get("model", state)
        out[str(path.relative_to(folder))] = {
            k: v for k, v in model.items() if isinstance(v, torch.Tensor)
        }
    return out


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    assert wa
    assert all(wa.values())
    for name in wa:
        assert wa[name].keys() == wb[name].keys()
        for key, tensor in wa[name].items():
            assert torch.equal(tensor, wb[name][key]), (name, key)


def _steps(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in deterministic(r).items() if not k.startswith("recovery/")}
        for r in history
    ]


def _check_recovered(faulty: Any, clean: Any, failed_step: int, from_step: int) -> None:
    _assert_same_weights(faulty.checkpoint, clean.checkpoint)
    history = read_metrics(faulty.output.metrics_path)
    assert _steps(history) == _steps(read_metrics(clean.output.metrics_path))
    marked = [r for r in history if "recovery/count" in r]
    assert len(marked) == 1
    assert marked[0]["recovery/count"] == 1
    assert marked[0]["recovery/failed_step"] == failed_step
    assert marked[0]["recovery/from_step"] == from_step
    assert marked[0]["step"] == from_step + 1


def test_local_actor_death_recovers_bit_identically(tmp_path: Path) -> None:
    base: dict[str, Any] = {"backend": "local", "steps": 4, "save_every": 2, "val_every": 2}
    clean = run(tiny_config(tmp_path / "clean", **base))
    with SpanRecorder() as recorder:
        faulty = run(tiny_config(tmp_path / "faulty", inject_fault="actor:0@step=4", **base))
    _check_recovered(faulty, clean, failed_step=4, from_step=2)
    assert [s.method for s in recorder.spans].count("recovery") == 1


def test_a_death_before_the_first_periodic_checkpoint_goes_back_to_step_0(
    tmp_path: Path,
) -> None:
    """Before the first periodic checkpoint the run goes back to the one fit saved before
    its first step, and ends as a run without the fault does."""
    base: dict[str, Any] = {"backend": "local", "steps": 3, "save_every": 3, "val_every": 3}
    clean = run(tiny_config(tmp_path / "clean", **base))
    faulty = run(tiny_config(tmp_path / "faulty", inject_fault="critic:0@step=2", **base))
    _check_recovered(faulty, clean, failed_step=2, from_step=0)


def test_recoveries_are_bounded(tmp_path: Path) -> None:
    config = tiny_config(
        tmp_path,
        backend="local",
        steps=3,
        save_every=1,
        max_recoveries=0,
        inject_fault="actor:0@step=2",
    )
    with pytest.raises(TrainerRecoveryError, match=r"recovered 0 times \(max_recoveries=0\)"):
        run(config)


def test_fault_spec_and_config_errors(tmp_path: Path) -> None:
    assert FaultSpec.parse("actor:1@step=30") == FaultSpec("actor", 1, 30)
    spec = FaultSpec.parse("critic:0@step=3:update_critic+0.25")
    assert spec == FaultSpec("critic", 0, 3, "update_critic", 0.25, "kill")
    assert str(spec) == "critic:0@step=3:update_critic+0.25:kill"
    assert FaultSpec.parse(str(spec)) == spec
    raised = FaultSpec.parse("actor:1@step=2:update_actor:raise")
    assert (raised.method, raised.action, raised.delay_s) == ("update_actor", "raise", 0.0)
    assert FaultSpec.parse_all("actor:0@step=2, critic:1@step=3") == (
        FaultSpec("actor", 0, 2),
        FaultSpec("critic", 1, 3),
    )
    # the other kinds of fault are parsed by their own classes (DriverFault, NodeFault,
    # RewardFault): the worker faults of a mixed list are the worker parts alone
    mixed = "driver@step=2, actor:0@step=3, node@step=2, reward:1@step=2:hang, server:0@step=2"
    assert FaultSpec.parse_all(mixed) == (FaultSpec("actor", 0, 3), FaultSpec("server", 0, 2))
    for bad in (
        "actor1@step=3",
        "actor:1@step=0",
        "judge:0@step=2",  # no such role
        "actor:-1@step=2",
        "actor:1@step=2:raise",  # no method
        "actor:1@step=2:update_actor+0.5:raise",  # a raise has no delay
        "actor:1@step=2:update_actor+x",
        "",
    ):
        with pytest.raises(TrainerConfigError, match="inject_fault"):
            FaultSpec.parse_all(bad)
    with pytest.raises(TrainerConfigError, match="standby must be an int >= 0, got -1"):
        tiny_config(tmp_path, standby=-1)
    with pytest.raises(TrainerConfigError, match="standby=1 keeps spare worker processes"):
        tiny_config(tmp_path, backend="local", workers_per_role=1, standby=1)
    with pytest.raises(TrainerConfigError, match="keep_checkpoints must be >= 1, got 0"):
        tiny_config(tmp_path, keep_checkpoints=0)
    with pytest.raises(TrainerConfigError, match="background_checkpoints must be a bool"):
        tiny_config(tmp_path, background_checkpoints="yes")
    with pytest.raises(TrainerConfigError, match="this run has no critic"):
        tiny_config(tmp_path, algorithm="grpo", inject_fault="critic:0@step=2")
    with pytest.raises(TrainerConfigError, match="placement='separate'"):
        tiny_config(tmp_path, inject_fault="rollout:0@step=2")
    with pytest.raises(TrainerConfigError, match="rank 2 is outside the 2 workers"):
        tiny_config(tmp_path, workers_per_role=2, inject_fault="actor:2@step=2")
    with pytest.raises(TrainerConfigError, match="max_recoveries must be >= 0, got -1"):
        tiny_config(tmp_path, max_recoveries=-1)


def test_a_fault_inside_a_method_recovers_and_a_raised_one_ends_the_run(tmp_path: Path) -> None:
    """In-process: a kill armed in update_actor reports the rank dead after the update ran;
    the run recovers and ends as the clean run does. A raised fault is an error, not a
    death: the run stops with it."""
    base: dict[str, Any] = {"backend": "local", "steps": 4, "save_every": 2, "val_every": 4}
    clean = run(tiny_config(tmp_path / "clean", **base))
    faulty = run(
        tiny_config(tmp_path / "faulty", inject_fault="actor:0@step=3:update_actor", **base)
    )
    _check_recovered(faulty, clean, failed_step=3, from_step=2)
    with pytest.raises(WorkerError, match="rank 0") as raised:
        run(
            tiny_config(
                tmp_path / "raised", inject_fault="critic:0@step=2:update_critic:raise", **base
            )
        )
    assert isinstance(raised.value, InjectedFaultError)


@pytest.mark.parametrize("background", [True, False])
def test_checkpoints_complete_and_only_the_newest_are_kept(
    tmp_path: Path, background: bool
) -> None:
    config = tiny_config(
        tmp_path,
        backend="local",
        steps=5,
        save_every=1,
        val_every=5,
        keep_checkpoints=2,
        background_checkpoints=background,
    )
    result = run(config)
    root = result.output.checkpoint_root
    assert sorted(p.name for p in root.iterdir()) == ["global_step_4", "global_step_5", "latest"]
    assert (root / "latest").read_text().strip() == "5"
    for folder in ("global_step_4", "global_step_5"):
        step = int(folder.removeprefix("global_step_"))
        assert published_step(root / folder / "actor") == step
        assert published_step(root / folder / "critic") == step
        saved = read_metrics(root / folder / "metrics.jsonl")
        assert [r["step"] for r in saved] == list(range(step + 1))  # the records up to it


# --- the recovery's own decisions, without workers ---------------------------------------


class _Group:
    """What :class:`Recovery` asks of a worker group: its dead ranks and replace_ranks."""

    def __init__(self, dead: list[int], replace_error: BaseException | None = None) -> None:
        self.name_prefix = "g"
        self.dead_ranks = dead
        self.replace_error = replace_error

    def check_worker_aliveness(self) -> None:
        pass

    def replace_ranks(self) -> list[int]:
        if self.replace_error is not None:
            raise self.replace_error
        return list(self.dead_ranks)


def _gloo_error() -> WorkerError:
    lost = RuntimeError(
        "[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:8387: Connection reset by peer"
    )
    return WorkerError("update_actor", 0, "RuntimeError", str(lost), "", cause=lost)


def test_an_error_that_lost_a_peer_is_told_from_a_workers_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert lost_peer(_gloo_error())
    wrapped = RuntimeError("weight sync failed")
    wrapped.__cause__ = RuntimeError("NCCL error: remote process exited or network error")
    assert lost_peer(wrapped)
    own = InjectedFaultError("injected fault in update_actor on rank 0")
    assert not lost_peer(WorkerError("update_actor", 0, "InjectedFaultError", str(own), ""))
    assert not lost_peer(None)
    monkeypatch.setenv("SC_TRAINER_LOST_PEER_GRACE_S", "7")
    assert Recovery(3).lost_peer_grace_s == 7.0
    assert Recovery(3, lost_peer_grace_s=0.5).lost_peer_grace_s == 0.5


def test_a_lost_peer_is_waited_for_up_to_the_grace_then_the_error_stands() -> None:
    """No worker is ever found dead: the error itself ends the run, after the grace."""
    recovery = Recovery(3, lost_peer_grace_s=0.6)
    error = _gloo_error()
    group: Any = _Group(dead=[])
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        recovery.recover(3, error, [group], _no_checkpoint, _no_restore)
    assert info.value is error
    assert 0.6 <= time.monotonic() - started < 5.0
    assert recovery.count == 0


def test_workers_that_cannot_be_replaced_are_a_trainer_recovery_error(tmp_path: Path) -> None:
    recovery = Recovery(3)
    no_room = TimeoutError("rank 1 of group 'g' was not placed again: missing {CPU: 1}")
    group: Any = _Group(dead=[1], replace_error=no_room)
    with pytest.raises(TrainerRecoveryError) as info:
        recovery.recover(3, _gloo_error(), [group], lambda what: tmp_path, _no_restore)
    message = str(info.value)
    assert message.startswith("step 3: update_actor failed on rank 0: RuntimeError")
    assert "the dead workers could not be replaced: TimeoutError: rank 1 of group 'g'" in message
    assert "missing {CPU: 1}" in message
    assert info.value.__cause__ is no_room
    assert recovery.count == 0


def _no_checkpoint(what: str) -> Path:
    raise AssertionError(f"no worker died, nothing to prepare ({what})")


def _no_restore(checkpoint: Path) -> int:
    raise AssertionError(f"nothing to restore ({checkpoint})")
