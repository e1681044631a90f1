"""A detached run's driver connects to a standing cluster started as an operator starts it:
``ray start --head`` with Ray's token authentication on (Ray 2.59 and later turn it on when
``~/.ray/auth_token`` exists, which any local ``ray.init`` writes). The driver finds the token
itself; without one it fails within a bound, saying what to set (issue 38, item 8)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sc_integration._standing_cluster import StandingCluster

pytestmark = pytest.mark.timeout(300)

CONNECT = (
    "from sc_trainer.launch._connect import connect_to_cluster\n"
    "ray = connect_to_cluster(None, namespace='auth-test', log_to_driver=False)\n"
    "print('cpus', ray.cluster_resources().get('CPU'))\n"
)


@pytest.fixture(scope="module")
def token_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[StandingCluster, Path]]:
    """A cluster whose head found a token in its ~/.ray (the home, returned beside it), so it
    authenticates every driver."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        cluster = StandingCluster(tmp_path_factory.mktemp("rc"), num_cpus=2)
    finally:
        if old is None:
            del os.environ["HOME"]
        else:
            os.environ["HOME"] = old
    try:
        yield cluster, home
    finally:
        cluster.stop()


def _driver(cluster: StandingCluster, home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(cluster.env(), HOME=str(home))
    env.pop("RAY_AUTH_MODE", None)
    return subprocess.run(
        [sys.executable, "-c", CONNECT], env=env, capture_output=True, text=True, timeout=240
    )


def test_a_driver_with_the_token_connects(token_cluster: tuple[StandingCluster, Path]) -> None:
    cluster, home = token_cluster
    # the head's home holds the token: a driver of the same account finds it there
    done = _driver(cluster, home)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cpus 2.0" in done.stdout


def test_the_guides_commands_find_the_token_themselves(
    token_cluster: tuple[StandingCluster, Path],
) -> None:
    """``sc-demo --teardown`` and ``--run-id`` import sc-ray, which imports Ray: the mode is
    decided before that import, not only in connect_to_cluster."""
    cluster, home = token_cluster
    env = dict(cluster.env(), HOME=str(home))
    env.pop("RAY_AUTH_MODE", None)
    cli = [sys.executable, "-m", "sc_trainer.cli", "--no-progress", "--address", cluster.address]
    down = subprocess.run(
        [*cli, "--teardown", "no-such-run"], env=env, capture_output=True, text=True, timeout=240
    )
    assert down.returncode == 1
    assert "cannot connect" not in down.stderr
    expected = "teardown_run('no-such-run'): the cluster holds no actor"
    assert expected in down.stderr, down.stderr[-2000:]
    attach = subprocess.run(
        [*cli, "--run-id", "no-such-run", "--attach", "--steps", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert attach.returncode != 0
    assert "cannot connect" not in attach.stderr
    expected = "RayRun.attach('no-such-run'): no run 'no-such-run'"
    assert expected in attach.stderr, attach.stderr[-2000:]


def test_a_driver_without_the_token_fails_saying_what_to_set(
    token_cluster: tuple[StandingCluster, Path], tmp_path: Path
) -> None:
    started = time.monotonic()
    done = _driver(token_cluster[0], tmp_path)  # a home without ~/.ray/auth_token
    took = time.monotonic() - started
    assert done.returncode != 0
    assert "ClusterConnectError" in done.stderr
    assert "RAY_AUTH_MODE=token" in done.stderr
    assert "~/.ray/auth_token" in done.stderr
    assert took < 120, f"the refused driver took {took:.0f} s to fail"


def test_nothing_listening_fails_at_once(tmp_path: Path) -> None:
    code = CONNECT.replace("connect_to_cluster(None", "connect_to_cluster('127.0.0.1:9'")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0
    assert "no Ray cluster answers at 127.0.0.1:9" in done.stderr
    assert time.monotonic() - started < 60
