"""The glossary (docs/architecture.md) gives each word one meaning; the classes the seven
distributions export use its words in that meaning. Each rule below reads a word in class
names (a CamelCase part such as ``Session`` in ``AgentSession``) and says where a class
may carry it; the word must be in the glossary. A new class named against a rule fails
here, with the rule's reason."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from sc_dispatch import _public

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = [
    "sc_dispatch",
    "sc_protocol",
    "sc_core",
    "sc_ray",
    "sc_workers",
    "sc_rollout",
    "sc_trainer",
]
#: public modules that are tools rather than API (a mypy plugin imports mypy)
NOT_API = {"sc_core.mypy_plugin"}


def _parts(name: str) -> list[str]:
    """The CamelCase parts of a class name: ``VLLMEngineConfig`` -> VLLM, Engine, Config."""
    return re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z0-9]+|[A-Z]+", name)


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@dataclasses.dataclass(frozen=True)
class Rule:
    """Classes whose name has the part ``part`` must satisfy ``allowed(module, name)``."""

    word: str
    part: str
    allowed: Callable[[str, str], bool]
    meaning: str


ROLLOUT_SIDE = ("sc_rollout", "sc_trainer.rollout", "sc_trainer.agents", "sc_workers.rollout")
RULES = [
    Rule(
        "session",
        "Session",
        lambda m, n: _under(m, "sc_rollout"),
        "an agent session (sc-rollout); a driver's bookkeeping is not a session",
    ),
    Rule(
        "sampling params",
        "Params",
        lambda m, n: n != "SamplingParams" or _under(m, "sc_rollout"),
        "one SamplingParams, a rollout-engine request's (sc_rollout)",
    ),
    Rule(
        "plan",
        "Plan",
        lambda m, n: _under(m, "sc_dispatch") or n.endswith("TransferPlan"),
        "a call's WorkPlan (sc-dispatch), or a weight sync's TransferPlan",
    ),
    Rule(
        "router",
        "Router",
        lambda m, n: _under(m, "sc_rollout", "sc_trainer.rollout", "sc_trainer.agents"),
        "the rollout router over servers; a sticky mode's key mapping is an affinity",
    ),
    Rule(
        "server",
        "Server",
        lambda m, n: _under(m, "sc_rollout", "sc_trainer"),
        "a rollout server (an engine behind HTTP), run by sc-rollout or the trainer",
    ),
    Rule(
        "training engine",
        "Engine",
        lambda m, n: (
            (_under(m, "sc_workers") and not _under(m, "sc_workers.rollout"))
            or _under(m, *ROLLOUT_SIDE)
            or (_under(m, "sc_trainer") and "Rollout" in _parts(n))
        ),
        "a training engine in sc-workers, or a rollout engine on the rollout side",
    ),
    Rule(
        "rollout engine",
        "Engine",
        lambda m, n: not _under(m, "sc_workers.rollout") or "Rollout" in _parts(n),
        "in sc-workers a rollout engine says so (TorchRolloutEngine); Engine alone is training",
    ),
    Rule(
        "scope",
        "Scope",
        lambda m, n: _under(m, "sc_core", "sc_trainer.runs"),
        "a call scope: the step part of a call id",
    ),
    Rule(
        "run",
        "Run",
        lambda m, n: _under(m, "sc_ray", "sc_trainer"),
        "one training (a detached run on a standing cluster included)",
    ),
]


def exported_classes() -> list[tuple[str, str]]:
    """``(public module, class name)`` for every class the distributions export."""
    found: list[tuple[str, str]] = []
    for dist in DISTRIBUTIONS:
        for module_name in _public.public_modules(dist):
            if module_name in NOT_API:
                continue
            module = __import__(module_name, fromlist=["__all__"])
            for name in module.__all__:
                if isinstance(getattr(module, name), type):
                    found.append((module_name, name))
    return found


def violations(classes: Iterable[tuple[str, str]]) -> list[str]:
    """One line per class that uses a glossary word against its meaning."""
    out: list[str] = []
    for module, name in classes:
        for rule in RULES:
            if rule.part in _parts(name) and not rule.allowed(module, name):
                out.append(f"{module}.{name}: '{rule.word}' means {rule.meaning}")
    return out


def _glossary_words() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| \*\*([^*]+)\*\* \|", text, re.M))


def test_every_rule_is_a_glossary_word() -> None:
    assert {rule.word for rule in RULES} <= _glossary_words()


def test_the_exported_classes_use_the_glossary_words_in_their_meaning() -> None:
    classes = exported_classes()
    assert len(classes) > 300  # every distribution was read
    assert violations(classes) == []


@pytest.mark.parametrize(
    ("module", "name", "word"),
    [
        ("sc_trainer.runs", "RunSession", "session"),
        ("sc_workers.workers", "SamplingParams", "sampling params"),
        ("sc_protocol.ext", "RowPlan", "plan"),
        ("sc_dispatch.ext", "KeyRouter", "router"),
        ("sc_core", "ServerHandle", "server"),
        ("sc_protocol", "ScopeMap", "scope"),
        ("sc_workers.rollout", "DecodeEngine", "rollout engine"),
        ("sc_core", "RunInfo", "run"),
    ],
)
def test_a_class_named_against_the_glossary_fails(module: str, name: str, word: str) -> None:
    (line,) = violations([(module, name)])
    assert line.startswith(f"{module}.{name}: '{word}' means")


def test_the_parts_of_a_name() -> None:
    assert _parts("VLLMEngineConfig") == ["VLLM", "Engine", "Config"]
    assert _parts("AgentSession") == ["Agent", "Session"]
    assert _parts("TorchRolloutEngine") == ["Torch", "Rollout", "Engine"]
