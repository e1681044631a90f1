"""Runs that outlive their driver, on a standing cluster (``ray start``) with drivers in
other processes: create, SIGKILL the driver, re-attach to the same workers; a lease held by
a live driver; unknown runs; configuration and code mismatches; a worker that died while no
driver was attached; teardown; abandonment. Fingerprints are unit-tested without Ray."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import ray
from sc_core import CallIds, InvalidConfigError, WorkerDiedError
from sc_core.backend import free_port
from sc_ray import (
    RayClassWithInitArgs,
    RayRun,
    RunExistsError,
    RunIdError,
    RunInUseError,
    RunMismatchError,
    UnknownRunError,
    create_colocated_worker_cls,
    run_namespace,
    teardown_run,
)
from sc_ray import _ray_api as rapi
from sc_ray._fingerprint import config_fingerprint, fingerprint_differences

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the helper module, which the cluster's workers import too
from sc_ray_runs_helper import Optim, Owner, Tiny, pid_of  # noqa: E402

pytestmark = pytest.mark.timeout(120)

RUN = "main-run"


# --- the standing cluster and the drivers ------------------------------------------------


def _env(pythonpath: Path = HERE) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    # Ray >= 2.5x turns token authentication on for `ray start` clusters; a test cluster
    # on loopback needs none (its drivers would otherwise need the token file)
    env["RAY_AUTH_MODE"] = "disabled"
    env.pop("RAY_ADDRESS", None)
    return env


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A standing single-node cluster started by ``ray start`` in its own session and temp
    dir; stopped by killing that session's processes (never ``ray stop``, which would stop
    every cluster of this machine). Yields its address."""
    if rapi.is_initialized():
        rapi.shutdown()
    temp = tempfile.mkdtemp(prefix="scrun", dir="/tmp")
    port = free_port()
    ray_bin = str(Path(sys.executable).parent / "ray")
    command = [
        ray_bin, "start", "--head", "--block", f"--port={port}", f"--temp-dir={temp}",
        "--num-cpus=8", "--include-dashboard=false", "--node-ip-address=127.0.0.1",
        f"--dashboard-agent-listen-port={free_port()}",
    ]  # fmt: skip
    log = Path(temp) / "ray-start.log"
    with log.open("w") as out:
        head = subprocess.Popen(
            command, env=_env(), start_new_session=True, stdout=out, stderr=subprocess.STDOUT
        )
    address = f"127.0.0.1:{port}"
    try:
        # a driver connecting before the head is up can hang: wait for `ray start` to say so
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in log.read_text():
            if time.monotonic() > deadline or head.poll() is not None:
                pytest.fail(f"the standing cluster did not start: {log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield address
    finally:
        if rapi.is_initialized():
            rapi.shutdown()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _session_pids(head.pid):
                try:
                    os.kill(pid, sig)
                except OSError:
                    continue
            time.sleep(1)
        head.wait(timeout=10)
        shutil.rmtree(temp, ignore_errors=True)


def connect(address: str, namespace: str) -> None:
    """Connect this process as a driver in ``namespace``."""
    if rapi.is_initialized():
        rapi.shutdown()
    rapi.disable_uv_run_propagation()
    ray.init(address=address, namespace=namespace, log_to_driver=False, configure_logging=False)


@dataclass
class Driver:
    """A driver process of ``sc_ray_runs_helper``."""

    process: subprocess.Popen[str]
    first: dict[str, Any] = field(default_factory=dict)

    def ask(self, command: str) -> dict[str, Any]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(command + "\n")
        stdin.flush()
        return _line(stdout)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


def _line(stdout: IO[str]) -> dict[str, Any]:
    while True:
        line = stdout.readline()
        if not line:
            raise AssertionError("the driver exited without answering")
        if line.startswith("{"):
            out: dict[str, Any] = json.loads(line)
            return out


def start_driver(
    address: str,
    run_id: str,
    mode: str,
    *,
    lr: float = 0.001,
    abandon_s: float = 600.0,
    pythonpath: Path = HERE,
) -> Driver:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sc_ray_runs_helper",
            address,
            run_id,
            mode,
            str(lr),
            str(abandon_s),
        ],
        env=_env(pythonpath),
        cwd=str(pythonpath),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    driver = Driver(process)
    assert process.stdout is not None
    driver.first = _line(process.stdout)
    return driver


def attach_when_free(run_id: str, limit_s: float = 15.0) -> RayRun:
    """Attach, retrying while the dead driver's job is not yet reported dead."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            return RayRun.attach(run_id)
        except RunInUseError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


def cia(lr: float = 0.001) -> RayClassWithInitArgs[Tiny]:
    return RayClassWithInitArgs(Tiny, optim=Optim(lr))


def wait_until(check: Any, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.25)
    return bool(check())


@pytest.fixture(scope="module")
def first_driver(cluster: str) -> Iterator[Driver]:
    """The driver that created run RUN (a pool of 2, group ``g``), alive until a test kills it."""
    driver = start_driver(cluster, RUN, "create")
    try:
        yield driver
    finally:
        if driver.process.poll() is None:
            driver.kill()


# --- create, refuse, re-attach -------------------------------------------------------------


def test_the_creating_driver_builds_the_run(first_driver: Driver) -> None:
    first = first_driver.first
    assert first.get("error") is None, first
    assert first["epoch"] == 1
    assert first["attached"] is False
    assert len(set(first["pids"])) == 2


def test_attach_is_refused_while_the_driver_lives(cluster: str, first_driver: Driver) -> None:
    connect(cluster, run_namespace(RUN))
    with pytest.raises(RunInUseError, match=rf"pid {first_driver.process.pid} .*heartbeat"):
        RayRun.attach(RUN)
    with pytest.raises(RunExistsError, match=RUN):
        RayRun.create(RUN)
    assert first_driver.ask("bump") == {"bump": [1, 1]}  # nothing changed
    rapi.shutdown()


def test_run_ids_and_namespaces_are_checked(cluster: str) -> None:
    with pytest.raises(RunIdError, match="not valid"):
        run_namespace("no spaces")
    with pytest.raises(RunIdError, match="not valid"):
        run_namespace("-leading-dash")
    connect(cluster, "somewhere-else")
    with pytest.raises(RunIdError, match=r"namespace 'somewhere-else'.*sc-run-"):
        RayRun.attach(RUN)
    rapi.shutdown()
    with pytest.raises(RunIdError, match="not initialised"):
        RayRun.create("fresh")


def test_a_new_driver_re_attaches_to_the_same_workers(cluster: str, first_driver: Driver) -> None:
    pids = first_driver.first["pids"]
    first_driver.kill()
    connect(cluster, run_namespace(RUN))
    run = attach_when_free(RUN)  # lease_s is 30 s: free at once because the job is dead
    try:
        assert (run.epoch, run.attached, run.run_id) == (2, True, RUN)
        assert run.namespace == "sc-run-main-run"
        pool = run.resource_pool("pool", [2])
        group = run.worker_group("g", pool, cia())
        assert group.pid() == pids  # no worker restarted
        assert group.bump() == [2, 2]  # nor re-initialised
        assert group.dead_ranks == []
        with pytest.raises(RunMismatchError, match=r"process_on_nodes: the run has \[2\]"):
            run.resource_pool("pool", [1])
    finally:
        run.release()
        rapi.shutdown()


def test_a_configuration_mismatch_is_refused(cluster: str) -> None:
    connect(cluster, run_namespace(RUN))
    run = RayRun.attach(RUN)  # released: free at once
    try:
        assert run.epoch == 3
        pool = run.resource_pool("pool", [2])
        with pytest.raises(
            RunMismatchError,
            match=r"group 'g' rank 0: optim\.lr: the run's workers have 0\.001, this driver 0\.002",
        ):
            run.worker_group("g", pool, cia(lr=0.002))
    finally:
        run.release()
        rapi.shutdown()


def test_a_code_mismatch_is_refused(cluster: str, tmp_path: Path) -> None:
    """The attaching driver imports an edited copy of the workers' module (same name)."""
    source = (HERE / "sc_ray_runs_helper.py").read_text()
    (tmp_path / "sc_ray_runs_helper.py").write_text(source + "\n# an edit\n")
    driver = start_driver(cluster, RUN, "attach", pythonpath=tmp_path)
    try:
        assert driver.first["error"] == "RunMismatchError", driver.first
        assert "rank 0: code: module sc_ray_runs_helper differs (sha256" in driver.first["message"]
    finally:
        driver.kill()


def test_unknown_run(cluster: str) -> None:
    connect(cluster, run_namespace("nope"))
    with pytest.raises(UnknownRunError, match=rf"no run 'nope'.*runs found: \['{RUN}'\]"):
        RayRun.attach("nope")
    rapi.shutdown()


def test_a_worker_dead_while_no_driver_was_attached(cluster: str) -> None:
    namespace = run_namespace(RUN)
    connect(cluster, namespace)
    victim = next(n for n in rapi.named_actors(namespace) if n.endswith("_0:1"))
    actor = rapi.get_actor(victim)
    rapi.kill(actor)
    assert wait_until(lambda: rapi.actor_state(actor) == "DEAD", 30)
    run = attach_when_free(RUN)
    try:
        pool = run.resource_pool("pool", [2])
        group = run.worker_group("g", pool, cia())
        assert group.dead_ranks == [1]
        with pytest.raises(WorkerDiedError):
            group.pid()
        assert group.replace_ranks() == [1]
        new_name = group.worker_names[1]
        assert new_name.endswith("-g1")
        assert new_name in rapi.named_actors(namespace)
        pids = group.pid()
    finally:
        run.release()
        rapi.shutdown()
    # the replacement is detached (outlived this driver) and recorded (found by name)
    connect(cluster, namespace)
    run = RayRun.attach(RUN)
    try:
        group = run.worker_group("g", run.resource_pool("pool", [2]), cia())
        assert group.worker_names[1] == new_name
        assert group.pid() == pids
        assert group.dead_ranks == []
    finally:
        run.release()
        rapi.shutdown()


def test_a_call_torn_by_a_killed_driver_is_completed_by_the_next_driver(
    cluster: str, tmp_path: Path
) -> None:
    """The first driver is killed while it hands ``meet`` (a collective) out: rank 0 runs
    it and waits for rank 1, which never got it. The next driver re-attaches at once (the
    busy rank answers its fingerprint on the control lane: not taken as lost), finds the
    torn call in the journals, gets the step's earlier call answered while rank 0 is busy,
    and completes ``meet`` by calling it again: same processes, each method run once."""
    run_id = "torn"
    driver = start_driver(cluster, run_id, "create")
    assert driver.first.get("error") is None, driver.first
    pids = driver.first["pids"]
    folder = tmp_path / "meet"
    folder.mkdir()
    assert driver.process.stdin is not None
    driver.process.stdin.write(f"torn {folder}\n")
    driver.process.stdin.flush()
    assert driver.process.wait(timeout=60) == -signal.SIGKILL
    assert [p.name for p in folder.iterdir()] == ["rank0"]  # rank 0 waits for rank 1
    connect(cluster, run_namespace(run_id))
    started = time.monotonic()
    run = attach_when_free(run_id)
    try:
        group = run.worker_group("g", run.resource_pool("pool", [2]), cia())
        assert group.dead_ranks == []  # the busy rank answered
        ids = CallIds(epoch=run.epoch)
        ids.begin(1)
        group.use_call_ids(ids)
        (torn,) = group.adopt_journals([1])
        attached_s = time.monotonic() - started
        assert (torn.method, torn.key, dict(torn.held), torn.missing) == (
            "meet",
            "meet#0",
            {0: "running"},
            (1,),
        )
        assert attached_s < 15, attached_s  # not the 30 s a lost rank costs
        assert group.bump() == [1, 1]  # answered from the journals; rank 0 is still busy
        assert group.meet(str(folder)) == [[0, 1], [0, 1]]
        assert group.pid() == pids  # no process replaced
        assert group.bump() == [3, 3]  # bump and meet ran once each on each rank
    finally:
        run.teardown()
        rapi.shutdown()


def _run_leftovers(namespace: str) -> tuple[list[str], dict[str, str]]:
    return rapi.named_actors(namespace), rapi.placement_groups_named(f"{namespace}:")


def test_teardown_run(cluster: str) -> None:
    namespace = run_namespace(RUN)
    connect(cluster, "an-operator")
    actors, groups = _run_leftovers(namespace)
    assert len(actors) >= 3
    assert len(groups) == 1
    info = teardown_run(RUN)
    assert info.run_id == RUN
    assert set(info.actors) == set(actors)
    assert "sc-run-registry" in info.actors
    assert info.placement_groups == ("sc-run-main-run:pool:0",)
    assert wait_until(lambda: _run_leftovers(namespace) == ([], {}), 30)
    states = {s.name: s.state for s in rapi.actor_states().values() if s.name in actors}
    assert wait_until(
        lambda: all(s.state == "DEAD" for s in rapi.actor_states().values() if s.name in states),
        30,
    )
    with pytest.raises(UnknownRunError, match=RUN):
        teardown_run(RUN)
    rapi.shutdown()


def test_a_colocated_group_re_attaches_and_spawns(cluster: str) -> None:
    """A colocated class's roles: their configuration is checked under ``<role>.``, and a
    re-attached group spawns its role groups over the same processes."""

    def colocated(lr: float) -> RayClassWithInitArgs[Any]:
        return create_colocated_worker_cls({"a": cia(lr), "b": cia(0.5)})

    namespace = run_namespace("coloc")
    connect(cluster, namespace)
    run = RayRun.create("coloc")
    try:
        group = run.worker_group("wd", run.resource_pool("pool", [2]), colocated(0.001))
        pids = group.spawn(["a"])["a"].pid()
        run.release()
        run = RayRun.attach("coloc")
        pool = run.resource_pool("pool", [2])
        with pytest.raises(
            RunMismatchError, match=r"a\.optim\.lr: the run's workers have 0\.001, this driver 0\.1"
        ):
            run.worker_group("wd", pool, colocated(0.1))
        again = run.worker_group("wd", pool, colocated(0.001))
        roles = again.spawn(["a", "b"])
        assert roles["a"].pid() == pids == roles["b"].pid()
        assert roles["a"].bump() == [1, 1]
    finally:
        run.teardown()
        rapi.shutdown()


def test_teardown_run_without_the_registry(cluster: str) -> None:
    """An operator's teardown finds the run's actors (a spare too) and placement groups
    through the cluster when the registry actor is gone."""
    namespace = run_namespace("orphan")
    connect(cluster, namespace)
    run = RayRun.create("orphan")
    group = run.worker_group("g", run.resource_pool("pool", [1]), cia(), standby=1)
    names = [*group.worker_names, *group.standby_names]
    assert names == ["g-Tiny_0:0", "g-Tiny_standby1"]
    run.release()
    assert rapi.kill_named("sc-run-registry", namespace)
    assert wait_until(lambda: "sc-run-registry" not in rapi.named_actors(namespace), 30)
    info = teardown_run("orphan")
    assert sorted(info.actors) == sorted(names)
    assert info.placement_groups == ("sc-run-orphan:pool:0",)
    assert wait_until(lambda: _run_leftovers(namespace) == ([], {}), 30)
    rapi.shutdown()


def _pids(names: list[str]) -> list[int]:
    """The process ids of the named actors (of this driver's namespace)."""
    refs = [rapi.call_in_actor(rapi.get_actor(n), pid_of) for n in names]
    return [int(p) for p in rapi.get(refs, timeout_s=60)]


def test_a_re_attached_group_adopts_its_spares(cluster: str) -> None:
    """A new driver keeps the previous driver's live spares (same actors, same processes):
    one takes over the next dead rank; a driver that asks for no standby stops them."""
    namespace = run_namespace("spares")
    connect(cluster, namespace)
    run = RayRun.create("spares")
    try:
        group = run.worker_group("g", run.resource_pool("pool", [2]), cia(), standby=1)
        group.wait_for_standby(timeout=60)
        spares = group.standby_names
        assert spares == ["g-Tiny_standby1"]
        spare_pids = _pids(spares)
        run.release()

        run = RayRun.attach("spares")
        group = run.worker_group("g", run.resource_pool("pool", [2]), cia(), standby=1)
        assert group.standby_names == spares  # adopted, not started again
        assert _pids(spares) == spare_pids
        group.wait_for_standby(timeout=60)
        group.kill_worker(1)
        assert group.replace_ranks() == [1]
        assert group.worker_names[1] == spares[0]  # the spare became rank 1
        assert group.pid()[1] == spare_pids[0]
        assert group.standby_names == ["g-Tiny_standby2"]  # a new one, numbered on
        run.release()

        run = RayRun.attach("spares")
        group = run.worker_group("g", run.resource_pool("pool", [2]), cia(), standby=1)
        assert group.worker_names[1] == spares[0]  # the replacement was recorded
        assert group.standby_names == ["g-Tiny_standby2"]
        run.release()

        run = RayRun.attach("spares")  # this driver keeps no spares
        group = run.worker_group("g", run.resource_pool("pool", [2]), cia())
        assert group.standby_names == []
        assert wait_until(lambda: "g-Tiny_standby2" not in rapi.named_actors(namespace), 30)
    finally:
        run.teardown()
        rapi.shutdown()


def test_recorded_actors_are_found_again_and_stopped_by_teardown(
    cluster: str, tmp_path: Path
) -> None:
    """Actors beside the groups (an engine-server fleet): recorded with the run, found by a
    driver that re-attaches, and stopped (their stop method) then killed by a teardown."""
    namespace = run_namespace("owners")
    connect(cluster, namespace)
    run = RayRun.create("owners")
    markers = [tmp_path / "owner-0", tmp_path / "owner-1"]
    names = ["fleet-0", "fleet-1"]
    for name, marker in zip(names, markers, strict=True):
        options = {"name": name, "lifetime": "detached", "num_cpus": 0}
        owner = rapi.create_actor(rapi.remote_class(Owner), options, (str(marker),), {})
        rapi.get([rapi.ready_ref(owner)], timeout_s=60)
    with pytest.raises(InvalidConfigError, match="record_actors"):
        run.record_actors("fleet", "fleet-0")
    assert run.actors("fleet") is None
    run.record_actors("fleet", names, stop_method="stop", engine="toy")
    run.release()
    rapi.shutdown()

    connect(cluster, namespace)
    run = attach_when_free("owners")
    assert run.actors("fleet") == {"names": names, "stop_method": "stop", "engine": "toy"}
    run.release()
    rapi.shutdown()

    connect(cluster, "an-operator")
    info = teardown_run("owners")
    assert set(info.actors) == {*names, "sc-run-registry"}
    assert all(m.exists() for m in markers), "teardown did not stop the recorded actors"
    assert wait_until(lambda: _run_leftovers(namespace) == ([], {}), 30)
    rapi.shutdown()


def test_an_abandoned_run_releases_itself(cluster: str) -> None:
    run_id = "abandoned"
    driver = start_driver(cluster, run_id, "create", abandon_s=3.0)
    assert driver.first.get("error") is None, driver.first
    connect(cluster, "an-operator")
    namespace = run_namespace(run_id)
    assert len(_run_leftovers(namespace)[0]) == 3
    driver.kill()
    assert wait_until(lambda: _run_leftovers(namespace) == ([], {}), 3 + 12)
    rapi.shutdown()


def test_a_driver_that_lost_the_lease_is_fenced(cluster: str) -> None:
    """``attach(lease_s=0)`` takes the lease from a live holder (an operator's override):
    the old holder learns it at its next heartbeat and may not record anything more."""
    connect(cluster, run_namespace("fenced"))
    old = RayRun.create("fenced", lease_s=2.0, heartbeat_s=0.1)
    try:
        new = RayRun.attach("fenced", lease_s=0.0)
        assert (old.epoch, new.epoch) == (1, 2)
        assert wait_until(lambda: old.fenced, 10)
        with pytest.raises(RunInUseError, match=r"epoch 1\) lost the run's lease"):
            old.resource_pool("pool", [1])
        assert not new.fenced
        info = new.teardown()
        assert info.actors == ("sc-run-registry",)
        assert info.placement_groups == ()
    finally:
        old.release()
        rapi.shutdown()


# --- fingerprints (no Ray) -------------------------------------------------------------------


@dataclass
class _Inner:
    lr: float
    betas: tuple[float, float] = (0.9, 0.99)


class _Configured:
    def __init__(self, config: dict[str, Any], inner: _Inner, *, tag: object = None) -> None:
        pass


def test_config_fingerprints_flatten_to_dotted_paths() -> None:
    config = {"actor": {"optim": {"lr": 0.001}}, "name": "x", "many": list(range(100))}
    full = config_fingerprint(_Configured, (config, _Inner(0.1)), {"tag": object()})
    assert full["config.actor.optim.lr"] == "0.001"
    assert full["config.name"] == "'x'"
    assert full["config.many"] == repr(list(range(100)))  # long sequences: one repr
    assert full["inner.lr"] == "0.1"
    assert full["inner.betas.1"] == "0.99"
    assert full["tag"] == "<object object>"  # no memory address
    # positional or keyword: the same paths; sc's private keywords are not configuration
    by_name = config_fingerprint(
        _Configured, (), {"config": config, "inner": _Inner(0.1), "_sc_env": {"RANK": "0"}}
    )
    assert by_name == {k: v for k, v in full.items() if k != "tag"}
    # arguments the signature does not take: by position and keyword
    assert config_fingerprint(_Configured, (1,), {"zz": 2}) == {"args.0": "1", "zz": "2"}


def test_fingerprint_differences_name_both_values() -> None:
    ours = {"code": {"m": "a" * 64}, "config": {"x.lr": "0.002"}}
    theirs = {"code": {"m": "b" * 64}, "config": {"x.lr": "0.001", "x.extra": "1"}}
    assert fingerprint_differences(theirs, ours) == [
        f"code: module m differs (sha256 {'b' * 12} on the run's workers vs {'a' * 12} for "
        "this driver)",
        "x.extra: the run's workers have 1, this driver <absent>",
        "x.lr: the run's workers have 0.001, this driver 0.002",
    ]
    assert fingerprint_differences(ours, ours) == []
