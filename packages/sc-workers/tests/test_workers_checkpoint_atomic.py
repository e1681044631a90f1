"""Publishing a checkpoint is atomic: a process killed at any step of a save leaves a
loadable checkpoint at the path -- the previous one or the new one, never none -- and the
next save cleans up after it. Each kill happens in a process forked from a child, at the
k-th filesystem change the save makes (the test patches ``os`` in the fork; the library has
no test hooks).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _workers_helpers import critic_config
from sc_workers import CheckpointError, CriticWorker
from sc_workers.workers._checkpoint import published_checkpoint

HERE = Path(__file__).resolve().parent

# One child process builds the worker once, then forks once per job: the fork saves at step 2
# over a checkpoint of step 1, dying at the k-th call of one of the patched functions (the
# patches are made in the fork only). It prints the fork's exit status per job.
_CHILD = textwrap.dedent(
    """
    import json, os, shutil, signal, sys
    sys.path.insert(0, {here!r})
    os.environ.update(WORLD_SIZE="1", RANK="0")
    from _workers_helpers import critic_config
    from sc_workers import CriticWorker

    worker = CriticWorker(critic_config())
    worker.init_model()
    statuses = {{}}
    for kill_at, path in json.loads(sys.argv[1]):
        pid = os.fork()
        if pid == 0:
            calls = [0]

            def deadly(real):
                def wrapper(*args, **kwargs):
                    calls[0] += 1
                    if calls[0] == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*args, **kwargs)
                return wrapper

            for module, name in ((os, "replace"), (os, "rename"), (os, "mkdir"),
                                 (os, "unlink"), (os, "rmdir"), (shutil, "rmtree")):
                setattr(module, name, deadly(getattr(module, name)))
            worker.save_checkpoint(path, global_step=2)
            print("CALLS", calls[0], flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        statuses[kill_at] = status
    print("STATUSES", json.dumps(statuses), flush=True)
    """
)


def _step_of(path: Path) -> int:
    found = published_checkpoint(path)
    assert found is not None, f"no loadable checkpoint at {path}: {sorted(path.iterdir())}"
    step: int = json.loads((found / "meta.json").read_text())["global_step"]
    return step


def _run_child(jobs: list[tuple[int, Path]]) -> tuple[str, dict[int, int]]:
    """Run the jobs (kill at the k-th call, save to the path); the child's output and the
    wait status of each job's fork."""
    spec = json.dumps([[k, str(p)] for k, p in jobs])
    done = subprocess.run(
        [sys.executable, "-c", _CHILD.format(here=str(HERE)), spec],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    statuses = json.loads(done.stdout.split("STATUSES")[-1])
    return done.stdout, {int(k): int(v) for k, v in statuses.items()}


@pytest.fixture(autouse=True)
def _single_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")


@pytest.mark.timeout(600)
def test_a_save_killed_at_any_step_leaves_the_old_or_the_new_checkpoint(
    tmp_path: Path,
) -> None:
    worker = CriticWorker(critic_config())
    worker.init_model()
    # How many filesystem changes does an undisturbed save make?
    probe = tmp_path / "probe"
    worker.save_checkpoint(str(probe), global_step=1)
    out, statuses = _run_child([(10**6, probe)])
    assert statuses == {10**6: 0}, out
    total = int(out.split("CALLS")[-1].split()[0])
    assert total >= 6  # mkdir, pointer files, rename, cleanup: every step gets a kill
    paths = {k: tmp_path / f"kill{k}" for k in range(1, total + 1)}
    for path in paths.values():
        worker.save_checkpoint(str(path), global_step=1)
    _, statuses = _run_child(list(paths.items()))
    for kill_at in paths:
        assert os.WIFSIGNALED(statuses[kill_at]), (kill_at, statuses[kill_at])
        assert os.WTERMSIG(statuses[kill_at]) == signal.SIGKILL, kill_at
    seen: set[int] = set()
    for kill_at, path in paths.items():
        step = _step_of(path)
        assert step in (1, 2), (kill_at, step)
        seen.add(step)
        worker.load_checkpoint(str(path))  # the published checkpoint loads
        # The next save repairs whatever the dead one left behind.
        worker.save_checkpoint(str(path), global_step=3)
        assert _step_of(path) == 3
        names = sorted(p.name for p in path.iterdir())
        assert names[0] == "CURRENT"
        assert len(names) == 2, names  # one version, no .tmp or PENDING leftovers
    assert seen == {1, 2}  # the kills fell both before and after the switch


def test_load_falls_back_to_the_newest_complete_version(tmp_path: Path) -> None:
    worker = CriticWorker(critic_config())
    worker.init_model()
    path = tmp_path / "ckpt"
    worker.save_checkpoint(str(path), global_step=1)
    (path / "CURRENT").write_text("v999999")  # names nothing
    assert _step_of(path) == 1
    worker.load_checkpoint(str(path))
    (path / "CURRENT").unlink()
    assert _step_of(path) == 1


def test_a_checkpoint_of_the_previous_layout_still_loads(tmp_path: Path) -> None:
    worker = CriticWorker(critic_config())
    worker.init_model()
    path = tmp_path / "ckpt"
    worker.save_checkpoint(str(path), global_step=5)
    old = tmp_path / "old"
    (path / "v000001").rename(old)  # meta.json and rank files directly in the path
    worker.load_checkpoint(str(old))
    worker.save_checkpoint(str(old), global_step=6)  # migrates to the versioned layout
    assert sorted(p.name for p in old.iterdir()) == ["CURRENT", "v000001"]
    assert _step_of(old) == 6


def test_loading_refuses_files_that_need_full_unpickling(tmp_path: Path) -> None:
    worker = CriticWorker(critic_config())
    worker.init_model()
    path = tmp_path / "ckpt"
    worker.save_checkpoint(str(path))
    shard = path / "v000001" / "rank_00000_of_00001.pt"
    state = torch.load(shard, weights_only=True)
    state["extra"]["payload"] = _Arbitrary()
    torch.save(state, shard)
    with pytest.raises(CheckpointError, match=r"safe loading refuses"):
        worker.load_checkpoint(str(path))


class _Arbitrary:
    """A class a crafted checkpoint could name: unpickling it would run its code."""
