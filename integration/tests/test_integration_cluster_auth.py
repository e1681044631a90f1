"""A detached run's driver connects to a standing cluster started as an operator starts it:
``ray start --head`` with Ray's token authentication on (Ray 2.59 and later turn it on when
``~/.ray/auth_token`` exists, which any local ``ray.init`` writes). The driver finds the token
itself; without one it fails within a bound, saying what to set (issue 38, item 8).

Every driver process of the module starts at once (``drivers``): each spends its time
importing sc-trainer and Ray, or, refused, waiting on Ray's retries, and those overlap.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from sc_integration._standing_cluster import StandingCluster

pytestmark = pytest.mark.timeout(300)

#: a driver that connects to ``{address}`` and says how long the connect itself took (its
#: imports aside), whether it succeeded or raised
CONNECT = (
    "import sys, time\n"
    "from sc_trainer.launch._connect import connect_to_cluster\n"
    "started = time.monotonic()\n"
    "try:\n"
    "    ray = connect_to_cluster({address}, namespace='auth-test', log_to_driver=False)\n"
    "finally:\n"
    "    print(f'connect took {{time.monotonic() - started:.1f}} s', file=sys.stderr)\n"
    "print('cpus', ray.cluster_resources().get('CPU'))\n"
)


Exited = subprocess.CompletedProcess[str]


def _run(argv: list[str], env: dict[str, str]) -> Exited:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, check=False)


def _connect_s(done: Exited) -> float:
    """How long a CONNECT driver's ``connect_to_cluster`` call took, as it said."""
    found = re.search(r"connect took ([0-9.]+) s", done.stderr)
    if found is None:
        raise AssertionError(f"the driver did not say how long it took:\n{done.stderr}")
    return float(found.group(1))


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


@pytest.fixture(scope="module")
def drivers(
    token_cluster: tuple[StandingCluster, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Exited]]]:
    """The module's driver processes, by name, all started at once."""
    cluster, home = token_cluster
    # the head's home holds the token: a driver of the same account finds it there
    env = dict(cluster.env(), HOME=str(home))
    env.pop("RAY_AUTH_MODE", None)
    no_token = dict(env, HOME=str(tmp_path_factory.mktemp("no-token-home")))
    connect = [sys.executable, "-c", CONNECT.format(address="None")]
    nothing = [sys.executable, "-c", CONNECT.format(address="'127.0.0.1:9'")]
    cli = [sys.executable, "-m", "sc_trainer.cli", "--no-progress", "--address", cluster.address]
    runs = {
        "with the token": (connect, env),
        "without the token": (connect, no_token),
        "nothing listening": (nothing, dict(os.environ)),
        "teardown": ([*cli, "--teardown", "no-such-run"], env),
        "attach": ([*cli, "--run-id", "no-such-run", "--attach", "--steps", "2"], env),
    }
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        yield {name: pool.submit(_run, argv, run_env) for name, (argv, run_env) in runs.items()}


def test_a_driver_with_the_token_connects(drivers: dict[str, Future[Exited]]) -> None:
    done = drivers["with the token"].result()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cpus 2.0" in done.stdout


def test_the_guides_commands_find_the_token_themselves(
    drivers: dict[str, Future[Exited]],
) -> None:
    """``sc-demo --teardown`` and ``--run-id`` import sc-ray, which imports Ray: the mode is
    decided before that import, not only in connect_to_cluster."""
    down = drivers["teardown"].result()
    assert down.returncode == 1
    assert "cannot connect" not in down.stderr
    expected = "teardown_run('no-such-run'): the cluster holds no actor"
    assert expected in down.stderr, down.stderr[-2000:]
    attach = drivers["attach"].result()
    assert attach.returncode != 0
    assert "cannot connect" not in attach.stderr
    expected = "RayRun.attach('no-such-run'): no run 'no-such-run'"
    assert expected in attach.stderr, attach.stderr[-2000:]


def test_a_driver_without_the_token_fails_saying_what_to_set(
    drivers: dict[str, Future[Exited]],
) -> None:
    done = drivers["without the token"].result()  # a home without ~/.ray/auth_token
    assert done.returncode != 0
    assert "ClusterConnectError" in done.stderr
    assert "RAY_AUTH_MODE=token" in done.stderr
    assert "~/.ray/auth_token" in done.stderr
    took = _connect_s(done)
    assert took < 120, f"the refused driver took {took:.0f} s to fail"


def test_nothing_listening_fails_at_once(drivers: dict[str, Future[Exited]]) -> None:
    done = drivers["nothing listening"].result()
    assert done.returncode != 0
    assert "no Ray cluster answers at 127.0.0.1:9" in done.stderr
    took = _connect_s(done)
    assert took < 10, f"took {took:.1f} s"
