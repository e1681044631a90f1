"""Test sessions for the sc workspace.

Every package gets ``tests(<dist>)`` and ``typecheck(<dist>)``. Each installs only that
package, its declared dependencies and a root tooling group, from the lock
(``uv sync --locked --package <dist>``), so an import the package does not declare fails
there; ``tests(<dist>)`` adds the extras in ``TEST_EXTRAS`` (sc-workers' ``hf``), so that
the code behind them is tested. ``uv run nox -t <dist>`` runs one package's sessions.
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

PACKAGES = ["sc-dispatch", "sc-protocol", "sc-core", "sc-ray", "sc-workers"]
PACKAGE_PARAMS = [nox.param(dist, id=dist, tags=[dist]) for dist in PACKAGES]
#: extras a package's tests install, so that the code behind them is tested (sc-workers' hf
#: tests fail rather than skip in that session when transformers is missing)
TEST_EXTRAS = {"sc-workers": ["hf"]}


def _sync(session: nox.Session, *args: str) -> None:
    """Install exactly what the lock says for ``args`` into the session's virtualenv."""
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--no-default-groups",
        "--exact",
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
        *session.posargs,
        env={"SC_ISOLATED_PACKAGE": dist},
    )


@nox.session
@nox.parametrize("dist", PACKAGE_PARAMS)
def typecheck(session: nox.Session, dist: str) -> None:
    """mypy --strict on one package's sources and tests, with only its dependencies."""
    _sync(session, "--package", dist, "--group", "typecheck")
    pkg = _package_dir(dist)
    session.run("mypy", "--strict", os.path.join(pkg, "src"), os.path.join(pkg, "tests"))


@nox.session
@nox.parametrize("dist", PACKAGE_PARAMS)
def api(session: nox.Session, dist: str) -> None:
    """Breaking changes to the public API since the last release must be in the CHANGELOG.

    griffe compares ``packages/<dist>/src`` with the baseline ``api/<dist>.json`` (the last
    release); each breaking change must be named in the ``## Unreleased`` section of the
    package's CHANGELOG.md. ``python api/sc_api.py baseline --ref <tag>`` renews the baselines.
    """
    _sync(session, "--only-group", "api")
    session.run("python", os.path.join("api", "sc_api.py"), "check", dist)


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


@nox.session
def integration(session: nox.Session) -> None:
    """Cross-package tests: the trainer on Ray and locally, Ray-assembled workers."""
    _sync(session, "--package", "sc-integration", "--group", "test")
    session.run("pytest", os.path.join("integration", "tests"), *session.posargs)


@nox.session(name="typecheck(sc-integration)", tags=["sc-integration"])
def typecheck_integration(session: nox.Session) -> None:
    """mypy --strict on the trainer and the sc-demo command."""
    _sync(session, "--package", "sc-integration", "--group", "typecheck")
    session.run(
        "mypy", "--strict", os.path.join("integration", "src"), os.path.join("integration", "tests")
    )


EXTENSION_DIR = os.path.join("integration", "sc-ext-roundrobin")


@nox.session(name="tests(sc-ext-roundrobin)", tags=["sc-ext-roundrobin", "extension"])
def tests_ext_roundrobin(session: nox.Session) -> None:
    """The downstream extension's tests, with only sc-dispatch and sc-core installed."""
    _sync(session, "--package", "sc-ext-roundrobin", "--group", "test")
    session.run(
        "pytest",
        os.path.join(EXTENSION_DIR, "tests"),
        *session.posargs,
        env={"SC_ISOLATED_PACKAGE": "sc-ext-roundrobin"},
    )


@nox.session(name="typecheck(sc-ext-roundrobin)", tags=["sc-ext-roundrobin", "extension"])
def typecheck_ext_roundrobin(session: nox.Session) -> None:
    """mypy --strict with sc-core's plugin (its pyproject's [tool.mypy]) on the extension."""
    _sync(session, "--package", "sc-ext-roundrobin", "--group", "typecheck")
    session.run(
        "mypy",
        "--config-file",
        os.path.join(EXTENSION_DIR, "pyproject.toml"),
        os.path.join(EXTENSION_DIR, "src"),
        os.path.join(EXTENSION_DIR, "tests"),
    )


@nox.session(tags=["typing"])
def typing(session: nox.Session) -> None:
    """Typed worker-group calls: mypy (with and without the plugin) and pyright on the cases.

    They must accept packages/sc-core/typing_tests/ok_*.py and reject each marked line of
    bad_*.py with the expected error code.
    """
    _sync(session, "--package", "sc-core", "--group", "typecheck", "--group", "test")
    session.run("pytest", os.path.join("packages", "sc-core", "typing_tests"), *session.posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks (not run by default): tables, JSON in integration/benchmarks/results."""
    _sync(session, "--package", "sc-integration")
    out = os.path.join("integration", "benchmarks", "results")
    for script in sorted(os.listdir(os.path.join("integration", "benchmarks"))):
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
