"""The toy engine keeps the rollout-engine contract: deterministic sampling with log-probs,
stop tokens, abort, pause and resume, versioned weights, sleep and wake up, clear errors."""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path

import pytest
from _rollout_helpers import PROPERTY, request, wait_until
from hypothesis import given
from hypothesis import strategies as st
from sc_rollout import GenerateRequest, GenerateResult, RolloutEngine, SamplingParams, WeightUpdate
from sc_rollout.errors import (
    EngineStateError,
    PromptTooLongError,
    RolloutConfigError,
    RolloutRequestError,
    RolloutTypeError,
    WeightLoadError,
    WeightVersionError,
)
from sc_rollout.testing import ToyEngine, ToyEngineConfig

pytestmark = pytest.mark.timeout(30)

VOCAB = 16


def _sample(engine: ToyEngine, **sampling: object) -> GenerateResult:
    params = SamplingParams(**{"max_tokens": 8, **sampling})  # type: ignore[arg-type]
    return engine.generate(GenerateRequest((1, 2, 3), params))


def test_it_is_a_rollout_engine() -> None:
    assert isinstance(ToyEngine(), RolloutEngine)


@PROPERTY
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10),
    max_tokens=st.integers(1, 30),
    temperature=st.floats(0, 3),
    top_p=st.floats(0.05, 1),
    seed=st.integers(0, 2**31),
    stops=st.lists(st.integers(0, VOCAB - 1), max_size=3),
)
def test_every_completion_keeps_the_contract(
    prompt: list[int],
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    stops: list[int],
) -> None:
    engine = ToyEngine()
    sampling = SamplingParams(max_tokens, temperature, top_p, seed, tuple(stops))
    result = engine.generate(GenerateRequest(prompt, sampling))
    again = ToyEngine().generate(GenerateRequest(prompt, sampling))
    assert (result.token_ids, result.logprobs) == (again.token_ids, again.logprobs)
    assert 1 <= len(result.token_ids) <= max_tokens
    assert all(0 <= t < VOCAB for t in result.token_ids)
    assert all(p <= 0 for p in result.logprobs)
    # a completion ends at its first stop token, or after max_tokens
    ended_on_stop = [i for i, t in enumerate(result.token_ids) if t in stops]
    if result.finish_reason == "stop":
        assert ended_on_stop == [len(result.token_ids) - 1]
    else:
        assert result.finish_reason == "length"
        assert not ended_on_stop
        assert len(result.token_ids) == max_tokens
    assert result.weight_version == result.min_weight_version == 0


def test_greedy_is_the_most_likely_token_and_top_p_near_zero_is_greedy() -> None:
    engine = ToyEngine()
    greedy = _sample(engine, temperature=0.0, seed=1)
    assert _sample(engine, temperature=0.0, seed=2).token_ids == greedy.token_ids
    nucleus = _sample(engine, temperature=2.0, top_p=1e-9, seed=3)
    # the same tokens; the log-probs are after temperature (flatter: lower), before top-p
    assert nucleus.token_ids == greedy.token_ids
    assert all(t < g for t, g in zip(nucleus.logprobs, greedy.logprobs, strict=True))
    assert _sample(engine, temperature=1.0, top_p=1e-9, seed=3).logprobs == greedy.logprobs
    first = [_sample(engine, max_tokens=1, seed=s) for s in range(60)]
    assert max(r.logprobs[0] for r in first) == greedy.logprobs[0]
    assert len({r.token_ids[0] for r in first}) > 1


def test_banned_tokens_are_never_sampled_and_log_probs_are_renormalised() -> None:
    engine = ToyEngine()
    greedy = _sample(engine, temperature=0.0, max_tokens=1)
    first = greedy.token_ids[0]
    other = _sample(engine, temperature=0.0, max_tokens=1, banned_token_ids=[first])
    assert other.token_ids[0] != first  # greedy takes the best token left
    # the log-prob is renormalised over the allowed tokens: log p(x) - log(1 - p(banned)),
    # p(x) the model's own, as an unbanned draw of the same token reports it
    second = next(
        r
        for r in (_sample(engine, max_tokens=1, seed=s) for s in range(200))
        if r.token_ids == other.token_ids
    )
    expected = second.logprobs[0] - math.log1p(-math.exp(greedy.logprobs[0]))
    assert other.logprobs[0] == pytest.approx(expected, abs=1e-12)
    assert other.logprobs[0] > second.logprobs[0]
    banned = list(range(0, 16, 2))
    for seed in range(30):
        result = _sample(engine, max_tokens=8, seed=seed, banned_token_ids=banned)
        assert not set(result.token_ids) & set(banned)


def test_a_stop_token_ends_the_completion_and_is_kept() -> None:
    engine = ToyEngine()
    free = _sample(engine, temperature=0.0, max_tokens=12)
    stop = free.token_ids[2]
    stopped = _sample(engine, temperature=0.0, max_tokens=12, stop_token_ids=[stop])
    end = free.token_ids.index(stop) + 1
    assert stopped.token_ids == free.token_ids[:end]
    assert stopped.finish_reason == "stop"


def test_new_weights_change_outputs_and_are_reported() -> None:
    engine = ToyEngine()
    before = _sample(engine, temperature=0.0)
    assert engine.load_weights(WeightUpdate(1)) == 1
    after = _sample(engine, temperature=0.0)
    assert after.token_ids != before.token_ids
    assert (after.weight_version, engine.weight_version(), engine.health().weight_version) == (
        1,
        1,
        1,
    )
    # the same version again reloads; an older one is refused and changes nothing
    assert engine.load_weights(WeightUpdate(1)) == 1
    with pytest.raises(WeightVersionError, match=r"version=0\) is below the version it holds, 1"):
        engine.load_weights(WeightUpdate(0))
    assert _sample(engine, temperature=0.0).token_ids == after.token_ids


def test_weights_from_a_file_follow_its_bytes(tmp_path: Path) -> None:
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    first.write_bytes(b"weights one")
    second.write_bytes(b"weights two")
    engines = [ToyEngine() for _ in range(3)]
    engines[0].load_weights(WeightUpdate(1, str(first)))
    engines[1].load_weights(WeightUpdate(1, str(second)))
    engines[2].load_weights(WeightUpdate(1, str(first)))
    outputs = [_sample(e, temperature=0.0, max_tokens=12).token_ids for e in engines]
    assert outputs[0] == outputs[2] != outputs[1]
    with pytest.raises(WeightLoadError) as info:
        engines[0].load_weights(WeightUpdate(2, str(tmp_path / "missing.bin")))
    assert "load_weights(version=2): cannot read" in str(info.value)
    assert "missing.bin" in str(info.value)
    assert isinstance(info.value, OSError)
    assert engines[0].weight_version() == 1
    # names no file system holds (a NUL; a lone surrogate, not encodable): not read either
    for name, reason in (("a\x00b", "embedded null byte"), ("a\ud800", "surrogates")):
        with pytest.raises(WeightLoadError, match=f"cannot read .*: .*{reason}"):
            engines[0].load_weights(WeightUpdate(2, str(tmp_path / name)))
    assert engines[0].weight_version() == 1
    with pytest.raises(RolloutTypeError, match=r"load_weights\(\) takes a WeightUpdate, got int"):
        engines[0].load_weights(3)  # type: ignore[arg-type]


def test_weights_from_a_directory_follow_its_files(tmp_path: Path) -> None:
    """A directory of weight files (what a trainer publishes for vLLM) seeds the table with
    its files' names and bytes."""
    dirs = [tmp_path / name for name in ("a", "b", "c")]
    for folder, data in zip(dirs, (b"one", b"two", b"one"), strict=True):
        (folder / "sub").mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(data)
        (folder / "sub" / "config.json").write_bytes(b"{}")
    engines = [ToyEngine() for _ in dirs]
    for engine, folder in zip(engines, dirs, strict=True):
        assert engine.load_weights(WeightUpdate(1, str(folder))) == 1
    outputs = [_sample(e, temperature=0.0, max_tokens=12).token_ids for e in engines]
    assert outputs[0] == outputs[2] != outputs[1]


def _in_thread(engine: ToyEngine, req: GenerateRequest) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(engine.generate(req)))
    thread.start()
    wait_until(lambda: engine.health().in_flight == 1, "the request in flight")
    return thread, out


def test_weights_loaded_during_a_request_apply_from_its_next_token() -> None:
    engine = ToyEngine(ToyEngineConfig(token_delay_s=0.02, context_length=128))
    thread, out = _in_thread(engine, request(max_tokens=50))
    time.sleep(0.25)
    engine.load_weights(WeightUpdate(1))
    thread.join(10)
    result = out[0]
    assert isinstance(result, GenerateResult)
    assert (result.min_weight_version, result.weight_version) == (0, 1)
    assert len(result.token_ids) == 50


def test_abort_returns_the_tokens_so_far() -> None:
    engine = ToyEngine(ToyEngineConfig(token_delay_s=0.02))
    req = request(max_tokens=100)
    thread, out = _in_thread(engine, req)
    assert engine.abort(req.request_id)
    thread.join(10)
    result = out[0]
    assert isinstance(result, GenerateResult)
    assert result.finish_reason == "abort"
    assert len(result.token_ids) == len(result.logprobs) < 100
    assert not engine.abort(req.request_id)
    assert not engine.abort("never-seen")


def test_pause_holds_requests_until_resume_and_abort_still_works() -> None:
    engine = ToyEngine()
    engine.pause()
    assert engine.health().paused
    thread, out = _in_thread(engine, request(max_tokens=3))
    time.sleep(0.1)
    assert thread.is_alive()
    assert not out
    engine.resume()
    thread.join(10)
    assert isinstance(out[0], GenerateResult)
    assert len(out[0].token_ids) == 3
    engine.pause()
    held = request(max_tokens=3)
    thread, out = _in_thread(engine, held)
    engine.load_weights(WeightUpdate(4))
    engine.abort(held.request_id)
    thread.join(10)
    result = out[0]
    assert isinstance(result, GenerateResult)
    assert (result.finish_reason, result.token_ids, result.weight_version) == ("abort", (), 4)


def test_sleep_and_wake_up() -> None:
    engine = ToyEngine()
    awake = _sample(engine, temperature=0.0)
    engine.sleep(1)
    assert engine.health().sleeping
    with pytest.raises(EngineStateError, match=r"while the engine sleeps; call wake_up"):
        _sample(engine)
    engine.wake_up()
    assert _sample(engine, temperature=0.0).token_ids == awake.token_ids
    engine.sleep(2)
    engine.load_weights(WeightUpdate(3))
    engine.wake_up()
    fresh = ToyEngine()
    fresh.load_weights(WeightUpdate(3))
    assert _sample(engine, temperature=0.0).token_ids == _sample(fresh, temperature=0.0).token_ids
    with pytest.raises(RolloutRequestError, match=r"sleep\(level\) takes 1 or 2, got 3"):
        engine.sleep(3)


def test_sleep_is_refused_while_requests_run() -> None:
    engine = ToyEngine()
    engine.pause()
    req = request()
    thread, _ = _in_thread(engine, req)
    with pytest.raises(EngineStateError, match=r"1 request\(s\) are in flight"):
        engine.sleep()
    engine.abort(req.request_id)
    thread.join(10)


def test_bad_requests_get_clear_errors() -> None:
    engine = ToyEngine(ToyEngineConfig(vocab_size=8, context_length=10))
    with pytest.raises(PromptTooLongError) as info:
        engine.generate(request(range(8), max_tokens=4))
    assert "a prompt of 8 tokens with max_tokens=4 needs 12 positions" in str(info.value)
    assert "the context length is 10" in str(info.value)
    assert isinstance(info.value, ValueError)
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    if limit:  # the longest int JSON carries: with the prompt, one digit more than str() takes
        nines = int("9" * limit)
        with pytest.raises(PromptTooLongError, match=r"needs \(an int of \d+ bits\) positions"):
            engine.generate(request([1], max_tokens=nines))
    with pytest.raises(RolloutRequestError, match=r"prompt token id 9 at position 1 is outside"):
        engine.generate(request([1, 9]))
    with pytest.raises(RolloutTypeError, match=r"generate\(\) takes a GenerateRequest"):
        engine.generate([1, 2])  # type: ignore[arg-type]
    engine.pause()
    held = request(request_id="same")
    thread, _ = _in_thread(engine, held)
    with pytest.raises(RolloutRequestError, match=r"request id 'same' is already in flight"):
        engine.generate(request(request_id="same"))
    engine.abort("same")
    thread.join(10)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"vocab_size": 1}, RolloutConfigError, "vocab_size must be >= 2, got 1"),
        ({"context_length": 0}, RolloutConfigError, "context_length must be >= 2"),
        ({"token_delay_s": -1.0}, RolloutConfigError, "token_delay_s must be a finite number"),
        ({"token_delay_s": "1"}, RolloutTypeError, "token_delay_s must be a number"),
        ({"model": ""}, RolloutConfigError, "model must be a non-empty str"),
        ({"seed": None}, RolloutTypeError, "seed must be an int, got None"),
    ],
)
def test_bad_configs_get_clear_errors(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=f"ToyEngineConfig.{words}".replace("(", r"\(")):
        ToyEngineConfig(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(RolloutTypeError, match=r"takes a ToyEngineConfig, got dict"):
        ToyEngine(kwargs)  # type: ignore[arg-type]
