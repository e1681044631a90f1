"""Public API baselines and the breaking-change check behind the ``api(<dist>)`` nox sessions.

Each released distribution has a baseline, ``api/<dist>.json``: griffe's description of its
public API at the last release, kept in the repository because a fresh clone may have no tags.

    python api/sc_api.py check sc-core
        griffe's ``find_breaking_changes`` between the baseline and ``packages/sc-core/src``;
        fails for every breaking change that the ``## Unreleased`` section of
        ``packages/sc-core/CHANGELOG.md`` does not mention, and prints the line to add. A
        package never released (no baseline, and a CHANGELOG with only an Unreleased
        section) passes: nothing of it can break yet.

    python api/sc_api.py baseline --ref v0.1.0 [dist ...]
        rewrites the baselines from the sources at a git ref (run at each release).

A breaking change counts as mentioned when one bullet of the unreleased section names the
object in backticks, by its path relative to the import package (``LocalWorkerGroup``,
``Worker.env``) or in full (``sc_core.LocalWorkerGroup``), or names its class and the member
separately (``LocalWorkerGroup``'s ``inline``); for a parameter the bullet also names the
parameter in backticks, and for a removal it says so (removed, renamed, private, replaced,
dropped, deleted, moved). Constructor parameters belong to the class (``LocalWorkerGroup``,
not ``LocalWorkerGroup.__init__``).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import logging
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parent.parent
API_DIR = ROOT / "api"
PACKAGES = (
    "sc-dispatch",
    "sc-protocol",
    "sc-core",
    "sc-ray",
    "sc-workers",
    "sc-rollout",
    "sc-trainer",
)
FORMAT = 1
#: the most names a package's top level may export (``__all__`` of its ``__init__``); the
#: rest belongs in its second tiers
MAX_TOP_LEVEL = {"sc-rollout": 25, "sc-trainer": 25}

log = logging.getLogger("sc_api")

_PARAMETER_KINDS = {
    griffe.BreakageKind.PARAMETER_MOVED,
    griffe.BreakageKind.PARAMETER_REMOVED,
    griffe.BreakageKind.PARAMETER_CHANGED_KIND,
    griffe.BreakageKind.PARAMETER_CHANGED_DEFAULT,
    griffe.BreakageKind.PARAMETER_CHANGED_REQUIRED,
    griffe.BreakageKind.PARAMETER_ADDED_REQUIRED,
}

#: a removal must be said to be one: a bullet that only names the object does not cover it
_REMOVALS = {griffe.BreakageKind.OBJECT_REMOVED, griffe.BreakageKind.PARAMETER_REMOVED}
_REMOVAL_WORDS = re.compile(r"\b(remov|renam|privat|replac|drop|delet|mov)", re.IGNORECASE)


def import_name(dist: str) -> str:
    return dist.replace("-", "_")


def baseline_path(dist: str) -> Path:
    return API_DIR / f"{dist}.json"


# --- baselines ------------------------------------------------------------------------------


def _strip(data: Any, prefix: str) -> Any:
    """Drop docstrings (not API) and make file paths relative to the repository root."""
    if isinstance(data, dict):
        data.pop("docstring", None)
        for key, value in data.items():
            if key in ("filepath", "relative_filepath") and isinstance(value, str):
                data[key] = value.removeprefix(prefix)
            else:
                _strip(value, prefix)
    elif isinstance(data, list):
        for value in data:
            _strip(value, prefix)
    return data


def write_baselines(ref: str, dists: Iterable[str]) -> None:
    """Write ``api/<dist>.json`` from the package sources at git ``ref``."""
    commit = _git("rev-parse", f"{ref}^{{commit}}").strip()
    with tempfile.TemporaryDirectory(prefix="sc-api-") as tmp:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", commit, "packages"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        for dist in dists:
            src = Path(tmp, "packages", dist, "src")
            if not src.is_dir():
                raise SystemExit(f"baseline: {dist} has no sources at {ref} ({commit[:12]})")
            version = _version(Path(tmp, "packages", dist, "pyproject.toml"))
            module = griffe.load(import_name(dist), search_paths=[str(src)])
            data = {
                "sc_api_baseline": FORMAT,
                "dist": dist,
                "version": version,
                "ref": ref,
                "commit": commit,
                "package": _strip(json.loads(module.as_json()), tmp + "/"),
            }
            out = baseline_path(dist)
            out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            log.info("wrote %s (%s %s at %s)", out.relative_to(ROOT), dist, version, commit[:12])


def _version(pyproject: Path) -> str:
    found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text("utf-8"), re.MULTILINE)
    if found is None:
        raise SystemExit(f"baseline: no version in {pyproject}")
    return found.group(1)


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def _decode(obj: dict[str, Any]) -> Any:
    # griffe's decoder takes any dict with a "cls" or "kind" key for an expression or object;
    # a members mapping with a member of that name (a class attribute called ``cls``) is not.
    for key in ("cls", "kind"):
        if key in obj and not isinstance(obj[key], str):
            return obj
    return griffe.json_decoder(obj)


def load_baseline(dist: str) -> tuple[dict[str, Any], griffe.Module]:
    path = baseline_path(dist)
    if not path.is_file():
        raise SystemExit(
            f"api({dist}): no baseline {path.relative_to(ROOT)}; a package released for the "
            f"first time gets one with: python api/sc_api.py baseline --ref <tag> {dist}"
        )
    data = json.loads(path.read_text(encoding="utf-8"), object_hook=_decode)
    module = data["package"]
    collection = griffe.ModulesCollection()
    collection.set_member(module.path, module)
    return data, module


# --- public paths ---------------------------------------------------------------------------


def _public_paths(package: griffe.Module) -> dict[str, set[str]]:
    """Map canonical paths (``sc_core._local.LocalWorkerGroup``) to the public paths that
    export them (``sc_core.LocalWorkerGroup``)."""
    paths: dict[str, set[str]] = {}

    def walk(module: griffe.Module | griffe.Alias) -> None:
        for name, member in module.members.items():
            if not member.is_public:
                continue
            public = f"{module.path}.{name}"
            target = member.target_path if member.is_alias else member.path
            paths.setdefault(target, set()).add(public)
            if not member.is_alias and member.is_module:
                walk(member)

    walk(package)
    return paths


def public_names(path: str, *maps: dict[str, set[str]]) -> set[str]:
    """The public spellings of ``path``: each exporting path with the rest of ``path``."""
    names: set[str] = set()
    for mapping in maps:
        for canonical, publics in mapping.items():
            if path == canonical or path.startswith(canonical + "."):
                rest = path[len(canonical) :]
                names.update(public + rest for public in publics)
    return {name.removesuffix(".__init__") for name in names if not _private(name)} or {
        path.removesuffix(".__init__")
    }


def _private(path: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in path.split("."))


# --- breakages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    kind: griffe.BreakageKind
    paths: tuple[str, ...]  #: public paths, full (``sc_core.LocalWorkerGroup``)
    parameter: str | None
    detail: str

    @property
    def title(self) -> str:
        where = self.paths[0] + (f"({self.parameter})" if self.parameter else "")
        return f"{where}: {self.kind.value}{self.detail}"

    def relative(self, path: str | None = None) -> str:
        """``path`` without its import package (``sc_core.Worker.env`` -> ``Worker.env``)."""
        return (path or self.paths[0]).partition(".")[2]

    def suggestion(self) -> str:
        rel = f"`{self.relative()}`"
        param = f"`{self.parameter}`"
        kind = griffe.BreakageKind
        text = {
            kind.OBJECT_REMOVED: f"{rel} is removed (say what replaces it)",
            kind.OBJECT_CHANGED_KIND: f"{rel} is now {self.detail.split('-> ')[-1]}",
            kind.PARAMETER_REMOVED: f"{rel}: the {param} parameter is removed",
            kind.PARAMETER_ADDED_REQUIRED: f"{rel}: new required parameter {param}",
            kind.PARAMETER_CHANGED_REQUIRED: f"{rel}: {param} is now required",
            kind.PARAMETER_CHANGED_DEFAULT: f"{rel}: {param} defaults to"
            f" {self.detail.split('-> ')[-1].rstrip(')')}",
            kind.PARAMETER_CHANGED_KIND: f"{rel}: {param} is now{self.detail}",
            kind.PARAMETER_MOVED: f"{rel}: {param} moved position",
            kind.CLASS_REMOVED_BASE: f"{rel} no longer subclasses what it did{self.detail}",
        }.get(self.kind, f"{rel}: {self.kind.value.lower()}{self.detail}")
        return f"- {text}."

    def mentioned_in(self, bullets: list[str]) -> bool:
        return any(self._matches(bullet) for bullet in bullets)

    def _matches(self, bullet: str) -> bool:
        # the leading name of each backticked span: `weights_only=True` names `weights_only`
        spans = re.findall(r"`([^`]+)`", bullet)
        ticked = {m.group() for m in map(re.compile(r"[\w.]+").match, spans) if m}
        if self.parameter is not None and self.parameter not in ticked:
            return False
        if self.kind in _REMOVALS and not _REMOVAL_WORDS.search(bullet):
            return False
        for path in self.paths:
            for form in (path, self.relative(path)):
                if not form:
                    continue
                if form in ticked:
                    return True
                parent, _, name = form.rpartition(".")
                if parent and parent in ticked and name in ticked:
                    return True
        return False


def _value(value: Any) -> str:
    if isinstance(value, griffe.Parameter):
        return value.name
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(getattr(value, "value", value))


def _detail(breakage: griffe.Breakage) -> str:
    kind = griffe.BreakageKind
    old, new = breakage.old_value, breakage.new_value
    if breakage.kind == kind.PARAMETER_CHANGED_DEFAULT:
        return f" ({old.default} -> {new.default})"
    if breakage.kind == kind.PARAMETER_CHANGED_KIND:
        return f" ({old.kind.value} -> {new.kind.value})"
    if breakage.kind in _PARAMETER_KINDS or breakage.kind == kind.OBJECT_REMOVED:
        return ""
    return f" ({_value(old)} -> {_value(new)})"


def changes(old: griffe.Module, new: griffe.Module) -> Iterator[Change]:
    maps = (_public_paths(old), _public_paths(new))
    for breakage in griffe.find_breaking_changes(old, new):
        parameter = None
        if breakage.kind in _PARAMETER_KINDS:
            parameter = (breakage.old_value or breakage.new_value).name
        paths = tuple(sorted(public_names(breakage.obj.path, *maps), key=lambda p: (len(p), p)))
        yield Change(breakage.kind, paths, parameter, _detail(breakage))


# --- changelog ------------------------------------------------------------------------------


def unreleased_bullets(changelog: Path) -> list[str] | None:
    """The bullets (with their continuation lines) of the ``## Unreleased`` section."""
    section: list[str] | None = None
    for line in changelog.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            if section is not None:
                break
            if line[3:].strip().lower().startswith("unreleased"):
                section = []
        elif section is not None:
            section.append(line)
    if section is None:
        return None
    bullets: list[str] = []
    for line in section:
        if re.match(r"\s*[-*] ", line):
            bullets.append(line)
        elif bullets and line.strip() and not line.startswith("#"):
            bullets[-1] += " " + line.strip()
    return bullets


def released(changelog: Path) -> list[str]:
    """The headings of released versions in a CHANGELOG (every ``## `` heading but
    ``## Unreleased``)."""
    if not changelog.is_file():
        return []
    return [
        line[3:].strip()
        for line in changelog.read_text(encoding="utf-8").splitlines()
        if line.startswith("## ") and not line[3:].strip().lower().startswith("unreleased")
    ]


def top_level_names(dist: str) -> list[str]:
    """The names the package's ``__init__`` lists in ``__all__`` (read, not imported)."""
    init = ROOT / "packages" / dist / "src" / import_name(dist) / "__init__.py"
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [str(ast.literal_eval(elt)) for elt in getattr(node.value, "elts", [])]
    return []


def check_size(dist: str) -> int:
    """Fails when the package's top level exports more than ``MAX_TOP_LEVEL`` allows."""
    limit = MAX_TOP_LEVEL.get(dist)
    if limit is None:
        return 0
    names = top_level_names(dist)
    if len(names) > limit:
        log.info(
            f"api({dist}): the top level exports {len(names)} names, more than {limit}; move "
            f"the extenders' names to a second tier: {sorted(names)}"
        )
        return 1
    log.info(f"api({dist}): the top level exports {len(names)} names (at most {limit})")
    return 0


def check(dist: str) -> int:
    return check_size(dist) | check_changes(dist)


def check_changes(dist: str) -> int:
    changelog = ROOT / "packages" / dist / "CHANGELOG.md"
    if not baseline_path(dist).is_file() and not released(changelog):
        # Nothing was released, so nothing can break: the first release writes the baseline.
        log.info(
            f"api({dist}): not released yet ({changelog.relative_to(ROOT)} has only an "
            f"Unreleased section), so no baseline to compare with; at its first release: "
            f"python api/sc_api.py baseline --ref <tag> {dist}"
        )
        return 0
    meta, old = load_baseline(dist)
    src = ROOT / "packages" / dist / "src"
    new = griffe.load(import_name(dist), search_paths=[str(src)])
    found = list(changes(old, new))
    rel_changelog = changelog.relative_to(ROOT)
    bullets = unreleased_bullets(changelog) if changelog.is_file() else None
    since = f"{meta['version']} ({meta['ref']}, {meta['commit'][:12]})"
    if not found:
        log.info(f"api({dist}): no breaking changes since {since}")
        return 0
    if bullets is None:
        bullets = []
        log.info(f'api({dist}): {rel_changelog} has no "## Unreleased" section; add one.')
    listed = [c for c in found if c.mentioned_in(bullets)]
    missing = [c for c in found if not c.mentioned_in(bullets)]
    log.info(f"api({dist}): {len(found)} breaking change(s) since {since}:")
    for change in listed:
        log.info(f"  ok       {change.title}")
    for change in missing:
        log.info(f"  MISSING  {change.title}")
    if not missing:
        log.info(f"api({dist}): each is listed in {rel_changelog} under Unreleased.")
        return 0
    log.info(
        f"\napi({dist}): {len(missing)} breaking change(s) are not in the Unreleased section of "
        f"{rel_changelog}.\nAdd these lines under '### Changed (breaking)' there (reword as "
        "you like, keeping the names in backticks; one line may cover several):\n"
    )
    for change in missing:
        log.info(f"    {change.suggestion()}")
    log.info(
        "\nA bullet covers a change when it names the object in backticks (relative to the "
        "package, e.g. `Worker.env`, or in full), or its class and the member separately; "
        "for a parameter, also the parameter in backticks; for a removal, a word saying so "
        "(removed, renamed, private, replaced, dropped, deleted, moved)."
    )
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check_p = sub.add_parser("check", help="compare a package with its baseline")
    check_p.add_argument("dist", choices=PACKAGES)
    base_p = sub.add_parser("baseline", help="write baselines from a git ref")
    base_p.add_argument("--ref", required=True, help="the release's tag or commit")
    base_p.add_argument("dists", nargs="*", help=f"default: {' '.join(PACKAGES)}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    logging.getLogger("griffe").setLevel(logging.ERROR)
    if args.command == "baseline":
        unknown = sorted(set(args.dists) - set(PACKAGES))
        if unknown:
            parser.error(f"baseline: unknown distributions {unknown}; known: {PACKAGES}")
        write_baselines(args.ref, args.dists or PACKAGES)
        return 0
    return check(args.dist)


if __name__ == "__main__":
    sys.exit(main())
