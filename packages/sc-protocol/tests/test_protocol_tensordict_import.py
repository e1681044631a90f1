"""Importing sc_protocol imports tensordict without torch._dynamo (sc_protocol._tensordict).

The import-order checks run in fresh interpreters: the test process has imported
tensordict already. The three start together (``fresh``): each spends seconds of one core
importing torch and tensordict.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import Any

import pytest
from sc_protocol import _tensordict

_FRESH_TIMEOUT_S = 180


def _run(*parts: str, **env: str) -> dict[str, Any]:
    """Run the code ``parts`` in a fresh interpreter; it prints one JSON object last."""
    code = "\n".join(textwrap.dedent(part) for part in parts)
    full_env = {k: v for k, v in os.environ.items() if k != "SC_PROTOCOL_EAGER_DYNAMO"}
    full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=_FRESH_TIMEOUT_S,
        env=full_env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


_REGISTERED = """
    from torch._dynamo import trace_rules
    import tensordict.base, tensordict.utils
    marked = [tensordict.utils._add_batch_dim_c, tensordict.base._foreach_copy_compiled]
    registered = [id(f) in trace_rules._allowed_callable_ids for f in marked]
"""


_ROUND_TRIP = """
    import json, pickle, sys
    import torch, sc_protocol
    from sc_protocol import DataProto, _tensordict
    data = DataProto.from_dict({"x": torch.arange(8.0).reshape(4, 2)}, meta_info={"k": 1})
    back = pickle.loads(pickle.dumps(DataProto.concat(data.chunk(2))))
    assert back.batch["x"].sum().item() == 28.0
    before = "torch._dynamo" in sys.modules
    pending = len(_tensordict.pending_allow_in_graph())
    hooked = _tensordict._hook in sys.meta_path
    restored = torch.compiler.allow_in_graph.__module__ == "torch.compiler"
    const = bool(getattr(__import__("tensordict.utils").utils._lock_warn,
                         "_dynamo_marked_constant", False))
"""
_ROUND_TRIP_REPORT = """
    print(json.dumps({"before": before, "pending": pending, "hooked": hooked,
                      "restored": restored, "const": const, "registered": registered,
                      "left": len(_tensordict.pending_allow_in_graph()),
                      "hooked_after": _tensordict._hook in sys.meta_path}))
"""
_EAGER = """
    import json, sys
    import sc_protocol
    from sc_protocol import _tensordict
    print(json.dumps({"dynamo": "torch._dynamo" in sys.modules,
                      "pending": len(_tensordict.pending_allow_in_graph()),
                      "hooked": _tensordict._hook in sys.meta_path}))
"""
_TENSORDICT_FIRST = """
    import json, sys
    import tensordict
    import sc_protocol
    from sc_protocol import _tensordict
    print(json.dumps({"pending": len(_tensordict.pending_allow_in_graph()),
                      "hooked": _tensordict._hook in sys.meta_path}))
"""


@pytest.fixture(scope="module")
def fresh() -> Iterator[dict[str, Future[dict[str, Any]]]]:
    """The fresh interpreters' reports, by check, all started at once."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        yield {
            "round trip": pool.submit(_run, _ROUND_TRIP, _REGISTERED, _ROUND_TRIP_REPORT),
            "eager": pool.submit(_run, _EAGER, SC_PROTOCOL_EAGER_DYNAMO="1"),
            "tensordict first": pool.submit(_run, _TENSORDICT_FIRST),
        }


@pytest.mark.slow  # a fresh interpreter imports torch and tensordict
def test_import_and_round_trip_leave_dynamo_out_then_dynamo_gets_the_marks(
    fresh: dict[str, Future[dict[str, Any]]],
) -> None:
    out = fresh["round trip"].result()
    assert out["before"] is False
    assert out["pending"] >= 2
    assert out["hooked"] is True
    assert out["restored"] is True
    assert out["const"] is True
    assert out["registered"] == [True, True]
    assert out["left"] == 0
    assert out["hooked_after"] is False


@pytest.mark.slow  # a fresh interpreter imports torch and tensordict
def test_eager_switch_imports_tensordict_as_it_is(
    fresh: dict[str, Future[dict[str, Any]]],
) -> None:
    assert fresh["eager"].result() == {"dynamo": True, "pending": 0, "hooked": False}


@pytest.mark.slow  # a fresh interpreter imports torch and tensordict
def test_tensordict_imported_first_is_left_alone(
    fresh: dict[str, Future[dict[str, Any]]],
) -> None:
    assert fresh["tensordict first"].result() == {"pending": 0, "hooked": False}


def test_deferred_marks_return_what_they_were_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tensordict, "_pending", [])
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)

    def one() -> None:
        return None

    def two() -> None:
        return None

    assert _tensordict._deferred_allow_in_graph(one) is one
    assert _tensordict._deferred_allow_in_graph((one, two)) == [one, two]
    assert _tensordict.pending_allow_in_graph() == (one, one, two)
    assert _tensordict._deferred_assume_constant_result(two) is two
    assert getattr(two, "_dynamo_marked_constant", False) is True


def test_flush_hands_every_mark_over_and_logs_a_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def good() -> None:
        return None

    def bad() -> None:
        return None

    seen: list[Any] = []

    def allow_in_graph(fn: Any) -> Any:
        if fn is bad:
            raise TypeError("cannot create weak reference")
        seen.append(fn)
        return fn

    fake = ModuleType("torch._dynamo")
    fake.allow_in_graph = allow_in_graph  # type: ignore[attr-defined]
    monkeypatch.setattr(_tensordict, "_pending", [bad, good])
    with caplog.at_level(logging.WARNING, logger="sc_protocol._tensordict"):
        _tensordict._flush(fake)
    assert seen == [good]
    assert _tensordict.pending_allow_in_graph() == ()
    assert "allow_in_graph" in caplog.text
    assert "bad" in caplog.text


def test_hook_ignores_other_modules() -> None:
    assert _tensordict._DynamoImportHook().find_spec("json", None) is None
