"""Test sessions for the sc workspace.

Every package gets ``tests(<dist>)`` and ``typecheck(<dist>)``. Each installs only that
package, its declared dependencies and a root tooling group, from the lock
(``uv sync --locked --package <dist>``), so an import the package does not declare fails
there; ``tests(<dist>)`` adds the extras in ``TEST_EXTRAS`` (sc-workers' ``hf``), so that
the code behind them is tested. ``uv run nox -t <dist>`` runs one package's sessions.

The release guards (docs/guides/contributing.md): ``api(<dist>)`` (breaking changes are in
the CHANGELOG), ``lowest(<dist>)`` (the lowest declared dependency versions, on the oldest
Python), ``pythons-<version>(<dist>)`` (the other supported Pythons, from the lock).

The other workspace members (integration/, integration/sc-ext-roundrobin/) get their
sessions generated from the root pyproject's ``[tool.uv.workspace] members``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys
from typing import Any

import nox

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - nox runs on the workspace's 3.11; pytest brings tomli on 3.10
    import tomli as tomllib

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

ROOT = os.path.dirname(os.path.abspath(__file__))
PACKAGES = [
    "sc-dispatch",
    "sc-protocol",
    "sc-core",
    "sc-ray",
    "sc-rollout",
    "sc-workers",
    "sc-trainer",
]
PACKAGE_PARAMS = [nox.param(dist, id=dist, tags=[dist]) for dist in PACKAGES]
#: extras a package's tests install, so that the code behind them is tested (sc-workers' hf
#: tests fail rather than skip in that session when transformers is missing; sc-trainer's
#: runs draw their plot, and its trackers' tests, which fail there too without their
#: backend, write to TensorBoard, W&B and MLflow)
TEST_EXTRAS = {"sc-workers": ["hf"], "sc-trainer": ["plot", "tensorboard", "wandb", "mlflow"]}
#: pytest arguments a package's tests session adds: every package leaves the further cases of
#: its matrices (marked ``extended``: layouts, engines, schedules beyond a representative) to
#: the extended session; sc-trainer's also leaves the long fault matrix (20 trainings) to the
#: faults session, running one case per kind of point, and the tests on the vLLM engine to
#: the vllm session (which makes vLLM's environment)
DEFAULT_TEST_ARGS = ["-m", "not extended"]
PACKAGE_TEST_ARGS = {"sc-trainer": ["-m", "not extended and not fault_matrix and not vllm"]}
#: pytest-xdist: two pytest processes, each running whole test modules (a module's Ray cluster
#: and fixtures stay in one process), where the modules share no state and one pytest
#: process leaves the second core idle (docs/guides/contributing.md has the figures). The
#: modules are handed out in collection order, where the root conftest.py puts the longest
#: first, not xdist's own order (most tests first), which left a long module of one or two
#: tests for last
PARALLEL_TEST_ARGS = ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]
#: the packages and members whose tests (and the guards' quick tests of a package) run in two
#: processes. Each process starts its own local Ray clusters (``address="local"``, never
#: another process's), and the integration session's standing clusters (``ray start``) have
#: temp dirs and ports of their own, which a ``ray.init()`` in the other process does not
#: look in. Not sc-protocol's, whose tests gained nothing
PARALLEL_TESTS = frozenset({"sc-integration", "sc-ray", "sc-rollout", "sc-trainer", "sc-workers"})

#: the Pythons the packages support (their classifiers; requires-python is >=3.10). The
#: oldest runs lowest(<dist>), the workspace's own (.python-version) runs tests(<dist>), the
#: others run pythons-<version>(<dist>).
SUPPORTED_PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
OLDEST_PYTHON = SUPPORTED_PYTHONS[0]
with open(os.path.join(ROOT, ".python-version"), encoding="utf-8") as _fh:
    WORKSPACE_PYTHON = _fh.read().strip()
OTHER_PYTHONS = [v for v in SUPPORTED_PYTHONS if v not in (OLDEST_PYTHON, WORKSPACE_PYTHON)]
#: packages whose pythons session runs on the newest Python only: they sit on torch and Ray
#: (whose wheels carry the version differences), which the oldest, the workspace's and the
#: newest Python already test; a middle version adds a minute of CI for little
MIDDLE_PYTHONS_SKIP = frozenset({"sc-protocol", "sc-ray", "sc-workers", "sc-trainer"})
#: what lowest(<dist>) and pythons-<version>(<dist>) run: pytest arguments relative to the
#: package's tests/ folder. By default the tests not marked slow; for sc-ray (whose tests start
#: Ray clusters) the cluster-free module and two tests of calls and their errors on actors;
#: for sc-workers all but the checkpoint module that kills a child process at every
#: filesystem step of a save; for sc-trainer the modules that need no Ray cluster and train
#: for at most a few steps in this process (not the injected driver and node faults, which
#: tests(sc-trainer) runs), and the trackers' (their extras' floors).
QUICK_TESTS: dict[str, list[str]] = {
    "sc-ray": [
        "test_ray_unit.py",
        "test_ray_worker_group.py::test_calls_blocking_and_not",
        "test_ray_worker_group.py::test_errors_deadlines_and_dead_workers",
    ],
    "sc-workers": [".", "-m", "not slow", "--ignore={tests}/test_workers_checkpoint_atomic.py"],
    "sc-trainer": [
        "test_trainer_task.py",
        "test_trainer_attached_driver.py",
        "test_trainer_agent_batch.py",
        "test_trainer_local.py",
        "test_trainer_loggers.py",
    ],
}


def _pyproject(path: str) -> dict[str, Any]:
    with open(os.path.join(ROOT, path, "pyproject.toml"), "rb") as fh:
        data: dict[str, Any] = tomllib.load(fh)
    return data


_ROOT_PYPROJECT = _pyproject(".")
#: the root [dependency-groups] test group, as requirements (lowest(<dist>) installs them
#: without the lock)
TEST_REQUIREMENTS: list[str] = [
    req for req in _ROOT_PYPROJECT["dependency-groups"]["test"] if isinstance(req, str)
]


def _members() -> list[str]:
    """The workspace members, as directories relative to the root, in pyproject order."""
    found: list[str] = []
    for pattern in _ROOT_PYPROJECT["tool"]["uv"]["workspace"]["members"]:
        for path in sorted(glob.glob(pattern, root_dir=ROOT)):
            if os.path.isfile(os.path.join(ROOT, path, "pyproject.toml")):
                found.append(path.replace(os.sep, "/"))
    return found


MEMBERS = _members()
_missing = sorted(
    {m.removeprefix("packages/") for m in MEMBERS if m.startswith("packages/")} - set(PACKAGES)
)
if _missing:
    raise RuntimeError(f"noxfile: add {_missing} to PACKAGES (in dependency order)")


def _project(member: str) -> dict[str, Any]:
    project: dict[str, Any] = _pyproject(member)["project"]
    return project


def _workspace_deps(dist: str) -> list[str]:
    """The workspace packages ``dist`` needs, directly or not, in PACKAGES order."""
    needed: set[str] = set()
    todo = [dist]
    while todo:
        for req in _project(f"packages/{todo.pop()}").get("dependencies", []):
            name = re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]
            if name in PACKAGES and name not in needed:
                needed.add(name)
                todo.append(name)
    return [p for p in PACKAGES if p in needed]


def _pyenv_python(version: str) -> str | None:
    """The newest pyenv install of ``version`` (``3.12`` -> ``.../3.12.1/bin/python3.12``)."""
    versions = os.path.join(
        os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv")), "versions"
    )
    found = []
    for folder in glob.glob(os.path.join(versions, f"{version}.*")):
        patch = os.path.basename(folder)[len(version) + 1 :]
        executable = os.path.join(folder, "bin", f"python{version}")
        if patch.isdigit() and os.access(executable, os.X_OK):
            found.append((int(patch), executable))
    return max(found)[1] if found else None


def _expose_pyenv_pythons() -> None:
    """Let nox and uv find every supported Python that pyenv has, whatever pyenv selects.

    pyenv's ``python3.12`` shim answers only when 3.12 is a selected version
    (``PYENV_VERSION``, ``.python-version``), and nox and uv stop at that failing shim, then
    try to download the interpreter. A folder of links named ``python<version>``, each to the
    pyenv install itself, goes first on ``PATH``; nothing else (``python``, ``python3``)
    changes. A supported Python that is not installed is named by :func:`_warn_missing_pythons`.
    """
    links = os.path.join(ROOT, ".nox", "pythons")
    os.makedirs(links, exist_ok=True)
    for version in SUPPORTED_PYTHONS:
        executable = _pyenv_python(version)
        link = os.path.join(links, f"python{version}")
        if executable is None or os.path.realpath(link) == executable:
            continue
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(executable, link)
    os.environ["PATH"] = os.pathsep.join([links, os.environ.get("PATH", "")])


def _warn_missing_pythons() -> None:
    """Name each supported Python found neither on ``PATH`` nor under pyenv, before nox
    starts: its guard sessions then fail with nox's "interpreter not found" (after uv tried
    to download it), which does not say how to install it."""
    for version in SUPPORTED_PYTHONS:
        if shutil.which(f"python{version}") is None:
            print(
                f"noxfile: Python {version} is not installed (not on PATH nor under pyenv); "
                f"the sessions that run on it fail unless uv can download it. Install it "
                f"with `pyenv install {version}` or `uv python install {version}`.",
                file=sys.stderr,
            )


def _cache_bytecode() -> None:
    """Let every process the sessions start keep Python's bytecode, under ``.nox/pycache``.

    uv installs packages without ``.pyc`` files, and a machine that sets
    ``PYTHONDONTWRITEBYTECODE`` (this project's does) then compiles torch, transformers,
    sympy and Ray from source in every process that imports them: each pytest process, each
    Ray worker, each driver a test starts. ``import sc_workers`` took 9 to 11 s that way
    and 3 s with the cache (docs/guides/contributing.md). With ``PYTHONPYCACHEPREFIX`` the
    cache is one folder under ``.nox/``, which nox owns: nothing is written beside the
    sources. A ``PYTHONPYCACHEPREFIX`` the caller set is kept.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ.setdefault("PYTHONPYCACHEPREFIX", os.path.join(ROOT, ".nox", "pycache"))


_expose_pyenv_pythons()
_warn_missing_pythons()
_cache_bytecode()


def _sync(session: nox.Session, *args: str) -> None:
    """Install exactly what the lock says for ``args`` into the session's virtualenv."""
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--no-default-groups",
        "--exact",
        # the session's Python, not the workspace's .python-version
        "--python",
        session.virtualenv.location,
        *args,
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        external=True,
    )


def _package_dir(dist: str) -> str:
    return os.path.join("packages", dist)


@nox.session
@nox.parametrize("dist", PACKAGE_PARAMS)
def tests(session: nox.Session, dist: str) -> None:
    """Run one package's tests with only its own dependencies (and tested extras) installed."""
    extras = [arg for extra in TEST_EXTRAS.get(dist, []) for arg in ("--extra", extra)]
    _sync(session, "--package", dist, "--group", "test", *extras)
    session.run(
        "pytest",
        os.path.join(_package_dir(dist), "tests"),
        *PACKAGE_TEST_ARGS.get(dist, DEFAULT_TEST_ARGS),
        *(PARALLEL_TEST_ARGS if dist in PARALLEL_TESTS else []),
        *session.posargs,
        env={"SC_ISOLATED_PACKAGE": dist},
    )


@nox.session
@nox.parametrize("dist", PACKAGE_PARAMS)
def typecheck(session: nox.Session, dist: str) -> None:
    """mypy --strict on one package's sources and tests, with only its dependencies (and the
    package's own ``[tool.mypy]`` when its pyproject has one: sc-trainer's plugin), then the
    package's typing_tests when it has them."""
    pkg = _package_dir(dist)
    typing_tests = os.path.join(pkg, "typing_tests")
    has_typing_tests = os.path.isdir(os.path.join(ROOT, typing_tests))
    groups = ["--group", "typecheck", *(["--group", "test"] if has_typing_tests else [])]
    _sync(session, "--package", dist, *groups)
    config = _pyproject(pkg).get("tool", {}).get("mypy")
    config_args = ["--config-file", os.path.join(pkg, "pyproject.toml")] if config else []
    session.run(
        "mypy", "--strict", *config_args, os.path.join(pkg, "src"), os.path.join(pkg, "tests")
    )
    if has_typing_tests:
        session.run("pytest", typing_tests)


@nox.session(tags=["guards"])
@nox.parametrize("dist", PACKAGE_PARAMS)
def api(session: nox.Session, dist: str) -> None:
    """Breaking changes to the public API since the last release must be in the CHANGELOG.

    griffe compares ``packages/<dist>/src`` with the baseline ``api/<dist>.json`` (the last
    release); each breaking change must be named in the ``## Unreleased`` section of the
    package's CHANGELOG.md. ``python api/sc_api.py baseline --ref <tag>`` renews the baselines.
    """
    _sync(session, "--only-group", "api")
    session.run("python", os.path.join("api", "sc_api.py"), "check", dist)


def _quick_tests(dist: str) -> list[str]:
    """pytest arguments for the fast subset of ``dist``'s tests (see QUICK_TESTS): options
    (``-m``, ``--ignore=...``) as they are, other arguments as paths under its tests/, then
    two pytest processes where ``dist`` is in PARALLEL_TESTS."""
    tests = os.path.join(_package_dir(dist), "tests")
    args = QUICK_TESTS.get(dist, [".", "-m", "not slow"])
    out: list[str] = []
    for prev, arg in zip(["", *args[:-1]], args, strict=True):
        is_option = arg.startswith("-") or prev == "-m"
        out.append(arg.format(tests=tests) if is_option else os.path.normpath(f"{tests}/{arg}"))
    return [*out, *(PARALLEL_TEST_ARGS if dist in PARALLEL_TESTS else [])]


@nox.session(python=OLDEST_PYTHON, tags=["lowest", "guards"])
@nox.parametrize("dist", [nox.param(dist, id=dist) for dist in PACKAGES])
def lowest(session: nox.Session, dist: str) -> None:
    """Quick tests at the lowest dependency versions allowed, on the oldest Python.

    Not from the lock: ``uv pip install --resolution lowest-direct`` of the package (with
    its tested extras), the workspace packages it needs and the root ``test`` group, so each
    lower bound it declares is one that works.
    """
    extras = ",".join(TEST_EXTRAS.get(dist, []))
    target = _package_dir(dist) + (f"[{extras}]" if extras else "")
    siblings = [arg for dep in _workspace_deps(dist) for arg in ("-e", _package_dir(dep))]
    session.install("--resolution", "lowest-direct", *siblings, "-e", target, *TEST_REQUIREMENTS)
    session.run("uv", "pip", "list", silent=False, external=True)
    session.run("pytest", *_quick_tests(dist), *session.posargs, env={"SC_ISOLATED_PACKAGE": dist})


@nox.session(python=OTHER_PYTHONS, tags=["pythons", "guards"])
@nox.parametrize("dist", [nox.param(dist, id=dist) for dist in PACKAGES])
def pythons(session: nox.Session, dist: str) -> None:
    """The package's quick tests on each other supported Python, from the lock (the packages
    built on torch and Ray on the newest only: see ``MIDDLE_PYTHONS_SKIP``)."""
    if session.python != SUPPORTED_PYTHONS[-1] and dist in MIDDLE_PYTHONS_SKIP:
        session.skip(
            f"{dist} runs on {OLDEST_PYTHON} (lowest), {WORKSPACE_PYTHON} (tests) and "
            f"{SUPPORTED_PYTHONS[-1]}; between them only the pure-Python packages run"
        )
    extras = [arg for extra in TEST_EXTRAS.get(dist, []) for arg in ("--extra", extra)]
    _sync(session, "--package", dist, "--group", "test", *extras)
    session.run("pytest", *_quick_tests(dist), *session.posargs, env={"SC_ISOLATED_PACKAGE": dist})


@nox.session(python=WORKSPACE_PYTHON, venv_backend="uv", tags=["wheels"])
def wheels(session: nox.Session) -> None:
    """The distributions as a user gets them: ``uv build`` makes every package's wheel, a fresh
    virtualenv (this session's, no workspace, nothing editable) gets sc-trainer and the sc
    distributions it needs from those wheels alone, their other dependencies from the index
    at the lock's versions (``uv export`` as constraints); then the installed ``sc-demo
    --backend local --steps 20`` must train, validate and checkpoint."""
    tmp = session.create_tmp()
    dist = os.path.join(tmp, "dist")
    shutil.rmtree(dist, ignore_errors=True)
    session.run(
        "uv", "build", "--all-packages", "--wheel", "--out-dir", dist, "--quiet", external=True
    )
    built = sorted(glob.glob(os.path.join(dist, "sc_*.whl")))
    wanted = ["sc-trainer", *_workspace_deps("sc-trainer")]
    chosen = [w for w in built if _wheel_dist(w) in wanted]
    missing = sorted(set(wanted) - {_wheel_dist(w) for w in chosen})
    if missing:
        session.error(f"uv build made no wheel of {missing} in {dist}")
    constraints = os.path.join(tmp, "constraints.txt")
    session.run(
        "uv",
        "export",
        "--frozen",
        "--package",
        "sc-trainer",
        "--no-emit-workspace",
        "--no-hashes",
        "--no-header",
        "--no-dev",
        "--quiet",
        "--output-file",
        constraints,
        external=True,
    )
    session.install("--constraints", constraints, *chosen)
    where = session.run(
        "python", "-c", "import sc_trainer; print(sc_trainer.__file__)", silent=True
    )
    if "site-packages" not in str(where):
        session.error(f"sc_trainer imported from {where!r}, not from the installed wheel")
    out = os.path.join(tmp, "sc-demo-wheel")
    shutil.rmtree(out, ignore_errors=True)
    session.run(
        "sc-demo", "--backend", "local", "--steps", "20", "--no-progress", "--output-dir", out
    )
    checkpoint = os.path.join(out, "checkpoints", "global_step_20", "trainer_state.json")
    if not os.path.isfile(checkpoint):
        session.error(f"sc-demo from the wheels left no complete checkpoint {checkpoint}")


def _wheel_dist(path: str) -> str:
    """The distribution name of a wheel file (``sc_core-0.2.0-py3-none-any.whl``: sc-core)."""
    return os.path.basename(path).split("-", 1)[0].replace("_", "-")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole workspace."""
    _sync(session, "--only-group", "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site, failing on any warning."""
    _sync(session, "--all-packages", "--group", "docs")
    session.run(
        "mkdocs", "build", "--strict", "--site-dir", os.path.join(session.create_tmp(), "site")
    )


#: a member's tests session keeps the name docs and CI already use
TEST_SESSION_NAMES = {"sc-integration": "integration"}
#: pytest arguments a member's tests session adds: the integration session leaves the long
#: fault matrix (20 trainings) to the faults session, runs one case per kind of point, and
#: leaves the tests on the vLLM engine to the vllm session (which makes vLLM's environment)
MEMBER_TEST_ARGS = {"sc-integration": ["-m", "not extended and not fault_matrix and not vllm"]}


def _member_sessions(member: str) -> None:
    """Register ``tests(<name>)`` and ``typecheck(<name>)`` for a workspace member that is
    not a released package (integration/, integration/sc-ext-roundrobin/).

    tests: pytest on ``<member>/tests`` with only the member's dependencies, and
    ``SC_ISOLATED_PACKAGE=<name>``. typecheck: mypy --strict on ``<member>/src`` and
    ``<member>/tests``, with ``--config-file <member>/pyproject.toml`` when that file has a
    ``[tool.mypy]`` table (sc-core's plugin, for instance), then pytest on
    ``<member>/typing_tests`` when the member has them.
    """
    name = str(_project(member)["name"])
    tags = [name, "members"]
    config = _pyproject(member).get("tool", {}).get("mypy")
    typing_tests = os.path.join(member, "typing_tests")
    has_typing_tests = os.path.isdir(os.path.join(ROOT, typing_tests))

    def tests_session(session: nox.Session) -> None:
        _sync(session, "--package", name, "--group", "test")
        session.run(
            "pytest",
            os.path.join(member, "tests"),
            *MEMBER_TEST_ARGS.get(name, DEFAULT_TEST_ARGS),
            *(PARALLEL_TEST_ARGS if name in PARALLEL_TESTS else []),
            *session.posargs,
            env={"SC_ISOLATED_PACKAGE": name},
        )

    def typecheck_session(session: nox.Session) -> None:
        groups = ["--group", "typecheck", *(["--group", "test"] if has_typing_tests else [])]
        _sync(session, "--package", name, *groups)
        config_args = ["--config-file", os.path.join(member, "pyproject.toml")] if config else []
        session.run(
            "mypy",
            "--strict",
            *config_args,
            os.path.join(member, "src"),
            os.path.join(member, "tests"),
        )
        if has_typing_tests:
            session.run("pytest", typing_tests)

    tests_session.__doc__ = f"{member}'s tests, with only {name}'s dependencies installed."
    typecheck_session.__doc__ = (
        f"mypy --strict on {member}"
        + (" with its pyproject's [tool.mypy]" if config else "")
        + (" and its typing_tests" if has_typing_tests else "")
        + "."
    )
    nox.session(name=TEST_SESSION_NAMES.get(name, f"tests({name})"), tags=tags)(tests_session)
    nox.session(name=f"typecheck({name})", tags=tags)(typecheck_session)


for _member in MEMBERS:
    if not _member.startswith("packages/"):
        _member_sessions(_member)


@nox.session(tags=["typing"])
def typing(session: nox.Session) -> None:
    """Typed worker-group calls: mypy (with and without the plugin) and pyright on the cases.

    They must accept packages/sc-core/typing_tests/ok_*.py and reject each marked line of
    bad_*.py with the expected error code.
    """
    _sync(session, "--package", "sc-core", "--group", "typecheck", "--group", "test")
    session.run("pytest", os.path.join("packages", "sc-core", "typing_tests"), *session.posargs)


#: test folders whose ``vllm``-marked tests the vllm and gpu sessions run
VLLM_TEST_DIRS = [
    os.path.join("packages", "sc-trainer", "tests"),
    os.path.join("integration", "tests"),
]
#: test folders whose ``gpu``-marked tests the gpu session runs, in this order
GPU_TEST_DIRS = [
    *(os.path.join(_package_dir(dist), "tests") for dist in PACKAGES),
    os.path.join("integration", "tests"),
]


@nox.session(default=False, tags=["gpu"])
def gpu(session: nox.Session) -> None:
    """GPU checks (not run by default; skipped without a CUDA device): every test marked
    ``gpu``, the vLLM tests on vLLM's CUDA build (its environment made first, flavor gpu),
    ``sc-demo --device cuda`` for a few steps, and the GPU benchmark
    (integration/benchmarks/results/gpu.json). ``integration/gpu-check.sh`` runs it."""
    _sync(session, "--all-packages", "--all-extras", "--group", "test")
    visible = session.run(
        "python", "-c", "import torch; print(torch.cuda.is_available())", silent=True
    )
    if "True" not in str(visible):
        session.skip("no CUDA device is visible (torch.cuda.is_available() is False)")
    for folder in GPU_TEST_DIRS:
        # exit code 5: the folder has no test marked gpu (sc-dispatch, sc-core, sc-rollout)
        session.run("pytest", folder, "-m", "gpu", *session.posargs, success_codes=[0, 5])
    session.run("python", "-m", "sc_rollout", "vllm-env", "create", "--flavor", "gpu")
    session.run("pytest", *VLLM_TEST_DIRS, "-m", "vllm", *session.posargs)
    out = os.path.join(session.create_tmp(), "sc-demo-cuda")
    session.run(
        "sc-demo",
        *("--device", "cuda", "--workers-per-role", "1", "--steps", "30"),
        *("--val-every", "10", "--no-progress", "--output-dir", out),
    )
    session.run(
        "python",
        os.path.join("integration", "benchmarks", "bench_gpu.py"),
        "--out",
        os.path.join("integration", "benchmarks", "results", "gpu.json"),
    )


@nox.session(default=False, tags=["faults"])
def faults(session: nox.Session) -> None:
    """The whole fault-injection matrix (not run by default): recovery in place, about 20
    short trainings on Ray, each with a rank killed; recovery with engine servers (a dead
    worker, a dead server, both, under partial rollout) and with a vLLM server (vLLM's
    environment is made first); a rollout rank killed inside a weight sync; re-attach,
    sixteen detached runs whose driver is killed and replaced (three while it hands a call
    out, three on engine servers), a server lost and a standby kept across drivers, the
    teardown of servers and spares; and a whole node lost from a two-node cluster, with and
    without room left for its ranks (see docs/guides/fault-tolerance.md)."""
    _sync(session, "--package", "sc-integration", "--group", "test")
    session.run("python", "-m", "sc_rollout", "vllm-env", "create")
    session.run(
        "pytest",
        os.path.join("packages", "sc-trainer", "tests", "test_trainer_fault_matrix.py"),
        os.path.join("packages", "sc-trainer", "tests", "test_trainer_server_faults.py"),
        os.path.join("packages", "sc-trainer", "tests", "test_trainer_sync_fault.py"),
        os.path.join("packages", "sc-trainer", "tests", "test_trainer_vllm_faults.py"),
        os.path.join("integration", "tests", "test_integration_reattach.py"),
        os.path.join("integration", "tests", "test_integration_node_loss.py"),
        *session.posargs,
        env={"SC_ISOLATED_PACKAGE": "sc-integration"},
    )


#: the test folders whose ``extended`` cases the extended session runs
EXTENDED_TEST_DIRS = [
    *(os.path.join(_package_dir(dist), "tests") for dist in PACKAGES),
    os.path.join("integration", "tests"),
]


@nox.session(default=False, tags=["extended"])
def extended(session: nox.Session) -> None:
    """The further cases of the test matrices (not run by default; see
    docs/guides/contributing.md): every test marked ``extended``, the layouts, schedules,
    engines and re-attach cases beyond the representative that each default session keeps,
    then the extended cases on vLLM (a training run; vLLM's environment is made first).
    One environment with every package (sc-integration's)."""
    _sync(session, "--package", "sc-integration", "--group", "test")
    env = {"SC_ISOLATED_PACKAGE": "sc-integration"}
    for folder in EXTENDED_TEST_DIRS:
        # exit code 5: the folder has no test marked extended
        session.run(
            "pytest",
            folder,
            "-m",
            "extended and not fault_matrix and not vllm and not gpu",
            *session.posargs,
            env=env,
            success_codes=[0, 5],
        )
    session.run("python", "-m", "sc_rollout", "vllm-env", "create")
    session.run(
        "pytest",
        *VLLM_TEST_DIRS,
        "-m",
        "extended and vllm and not fault_matrix",
        *session.posargs,
        env=env,
        success_codes=[0, 5],  # 5: the posargs selected no vLLM case
    )


@nox.session(tags=["vllm"])
def vllm(session: nox.Session) -> None:
    """The vLLM engine (docs/guides/rollout-engines.md): makes vLLM's own environment from
    sc-rollout's pinned requirement files (seconds when it is there already, a minute or two
    with downloads), then runs the tests marked ``vllm`` but not ``extended`` or
    ``fault_matrix`` (the engine against the trainer's model, one vLLM server); the
    ``extended`` session runs a training on vLLM, the ``faults`` session recovery with it."""
    _sync(session, "--package", "sc-integration", "--group", "test")
    session.run("python", "-m", "sc_rollout", "vllm-env", "create")
    env = {"SC_ISOLATED_PACKAGE": "sc-integration"}
    session.run(
        "pytest",
        *VLLM_TEST_DIRS,
        "-m",
        "vllm and not extended and not fault_matrix",
        *session.posargs,
        env=env,
    )


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks (not run by default): tables, JSON in integration/benchmarks/results. The
    GPU benchmark runs in the gpu session instead."""
    _sync(session, "--package", "sc-integration")
    out = os.path.join("integration", "benchmarks", "results")
    for script in sorted(os.listdir(os.path.join("integration", "benchmarks"))):
        if script == "bench_gpu.py":
            continue
        if script.startswith("bench_") and script.endswith(".py"):
            name = script.removeprefix("bench_").removesuffix(".py")
            session.run(
                "python",
                os.path.join("integration", "benchmarks", script),
                "--out",
                os.path.join(out, f"{name}.json"),
                *session.posargs,
            )
    session.run("python", os.path.join("integration", "benchmarks", "report.py"), "--results", out)
