"""The built-in rollout engine (``sc_workers.rollout``) keeps sc-rollout's engine contract
with a real model: a tiny GPT-2 and a word-level tokenizer built here, in a Hugging Face
directory, loaded as a user's checkpoint is.

Greedy completions equal a plain transformers loop token for token, every log-prob equals
an independent recomputation, seeded sampling repeats, concurrent requests (continuous
batching) equal the same requests run alone, abort, pause, weights loaded during a request
(its version span, the tokens that follow), weights that do not fit (refused, the old ones
kept), sleep and wake up, and a server process answering as the engine in-process does.
The nox session installs the ``hf`` extra, so there these tests must run, not skip.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

if os.environ.get("SC_ISOLATED_PACKAGE") == "sc-workers":
    importlib.import_module("transformers")  # the nox session installs sc-workers[hf]
else:
    pytest.importorskip("transformers")

from _workers_rollout_helpers import build_tiny_gpt2
from sc_rollout import (
    GenerateRequest,
    GenerateResult,
    RolloutClient,
    RolloutEngine,
    SamplingParams,
    ServerProcess,
    WeightUpdate,
)
from sc_rollout.errors import (
    EngineStateError,
    PromptTooLongError,
    RolloutRequestError,
    RolloutTypeError,
    WeightLoadError,
    WeightMismatchError,
    WeightVersionError,
)
from sc_workers import ConfigError, TorchRolloutEngine, TorchRolloutEngineConfig
from sc_workers.models import load_hf_model, window_forward, window_row
from sc_workers.rollout import torch_engine_argv
from sc_workers.workers._ppo import response_head

transformers: Any = importlib.import_module("transformers")
safetensors_torch: Any = importlib.import_module("safetensors.torch")

pytestmark = pytest.mark.timeout(120)

CERTAIN = 7  # the token the "certain" weights always produce
PROMPTS = [(2, 3, 4), (5,), (9, 8, 7, 6, 5, 4, 3, 2, 1, 0), (15, 15, 1)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_gpt2(tmp_path_factory.mktemp("rollout-engine"))


@pytest.fixture(scope="module")
def plain(model_dir: str) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def engine(model_dir: str) -> Iterator[TorchRolloutEngine]:
    """A shared engine for the tests that change nothing in it (batches of at most 3)."""
    with TorchRolloutEngine(TorchRolloutEngineConfig(model_dir, max_batch_size=3)) as shared:
        yield shared


@pytest.fixture
def own(model_dir: str) -> Iterator[Callable[..., TorchRolloutEngine]]:
    """A fresh engine per call (closed after the test), for tests that change its state."""
    made: list[TorchRolloutEngine] = []

    def make(**kwargs: Any) -> TorchRolloutEngine:
        made.append(TorchRolloutEngine(TorchRolloutEngineConfig(model_dir, **kwargs)))
        return made[-1]

    yield make
    for each in made:
        each.close()


# --- references ------------------------------------------------------------------------------


@torch.no_grad()
def plain_greedy(model: Any, prompt: Sequence[int], n: int) -> tuple[int, ...]:
    """Greedy decoding with transformers alone: the whole sequence each step, no cache."""
    sequence = list(prompt)
    for _ in range(n):
        logits = model(torch.tensor([sequence])).logits[0, -1]
        sequence.append(int(logits.argmax()))
    return tuple(sequence[len(prompt) :])


@torch.no_grad()
def recomputed(
    model: Any, prompt: Sequence[int], tokens: Sequence[int], temperature: float = 1.0
) -> list[float]:
    """Each token's log-prob as a trainer recomputes it: one forward over prompt + tokens,
    the logits divided by the temperature."""
    logits = model(torch.tensor([[*prompt, *tokens]])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def greedy(prompt: Sequence[int], n: int = 12, **kwargs: Any) -> GenerateRequest:
    return GenerateRequest(prompt, SamplingParams(max_tokens=n, temperature=0.0), **kwargs)


def sampled(prompt: Sequence[int], seed: int | None, n: int = 12) -> GenerateRequest:
    return GenerateRequest(
        prompt, SamplingParams(max_tokens=n, temperature=1.3, top_p=0.9, seed=seed)
    )


def state_of(model_dir: str, change: Callable[[dict[str, torch.Tensor]], None]) -> dict[str, Any]:
    """The model's tensors as ``save_pretrained`` writes them (no tied ``lm_head``), changed."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    change(state)
    return state


def make_certain(state: dict[str, torch.Tensor]) -> None:
    """The final norm outputs one direction that only ``CERTAIN``'s embedding points along."""
    state["transformer.ln_f.weight"].zero_()
    direction = torch.zeros(64)
    direction[0] = 1.0
    state["transformer.ln_f.bias"].copy_(direction)
    state["transformer.wte.weight"][:, 0] = 0.0
    state["transformer.wte.weight"][CERTAIN, 0] = 50.0


def save(path: Path, state: dict[str, Any]) -> str:
    safetensors_torch.save_file(state, str(path))
    return str(path)


def in_thread(
    engine: TorchRolloutEngine, request: GenerateRequest
) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(engine.generate(request)))
    thread.start()
    wait_until(lambda: engine.health().in_flight == 1, "the request in flight")
    return thread, out


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


def joined(thread: threading.Thread, out: list[Any]) -> GenerateResult:
    thread.join(30)
    assert not thread.is_alive()
    (result,) = out
    assert isinstance(result, GenerateResult)
    return result


# --- generation ------------------------------------------------------------------------------


def test_it_is_a_rollout_engine_with_its_model_s_health(
    engine: TorchRolloutEngine, model_dir: str
) -> None:
    assert isinstance(engine, RolloutEngine)
    health = engine.health()
    assert (health.model, health.context_length, health.weight_version) == ("tiny-gpt2", 64, 0)
    assert (health.paused, health.sleeping, health.in_flight) == (False, False, 0)
    assert engine.weight_version() == 0
    assert TorchRolloutEngineConfig(model_dir, name="mine").model_name == "mine"


def test_greedy_equals_plain_transformers_and_logprobs_the_recomputation(
    engine: TorchRolloutEngine, plain: Any
) -> None:
    for prompt in PROMPTS:
        result = engine.generate(greedy(prompt, 20))
        assert result.token_ids == plain_greedy(plain, prompt, 20)
        assert result.logprobs == pytest.approx(
            recomputed(plain, prompt, result.token_ids), abs=1e-5
        )
        assert (result.finish_reason, result.weight_version, result.min_weight_version) == (
            "length",
            0,
            0,
        )


def test_seeded_sampling_repeats_and_its_logprobs_are_the_tempered_model_s(
    engine: TorchRolloutEngine, plain: Any
) -> None:
    first = engine.generate(sampled(PROMPTS[0], seed=7, n=24))
    again = engine.generate(sampled(PROMPTS[0], seed=7, n=24))
    other = engine.generate(sampled(PROMPTS[0], seed=8, n=24))
    assert (first.token_ids, first.logprobs) == (again.token_ids, again.logprobs)
    assert other.token_ids != first.token_ids
    # after temperature (1.3), before top-p: what the trainer recomputes
    for result in (first, other):
        expected = recomputed(plain, PROMPTS[0], result.token_ids, 1.3)
        assert result.logprobs == pytest.approx(expected, abs=1e-5)
        raw = recomputed(plain, PROMPTS[0], result.token_ids)
        assert result.logprobs != pytest.approx(raw, abs=1e-3)
    unseeded = {engine.generate(sampled(PROMPTS[1], None)).token_ids for _ in range(3)}
    assert len(unseeded) > 1


def test_a_stop_token_ends_the_completion_and_is_kept(engine: TorchRolloutEngine) -> None:
    free = engine.generate(greedy(PROMPTS[0], 20))
    stop = free.token_ids[3]
    request = GenerateRequest(
        PROMPTS[0], SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=[stop])
    )
    stopped = engine.generate(request)
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
    assert stopped.finish_reason == "stop"


def test_banned_tokens_are_never_sampled_and_log_probs_are_the_actors_renormalised(
    engine: TorchRolloutEngine, plain: Any
) -> None:
    free = engine.generate(greedy(PROMPTS[0], 8))
    banned = sorted(set(free.token_ids))
    for seed in (None, 3):
        params = SamplingParams(max_tokens=8, temperature=0.0 if seed is None else 1.0, seed=seed)
        request = GenerateRequest(PROMPTS[0], dataclasses.replace(params, banned_token_ids=banned))
        result = engine.generate(request)
        assert not set(result.token_ids) & set(banned)
        # the actor's head, given the same bans as a banned_token_ids column, recomputes
        # the engine's log-probs: both renormalise over the allowed tokens
        tokens = torch.tensor([result.token_ids])
        column = torch.tensor(banned).expand(1, len(result.token_ids), len(banned))
        with torch.no_grad():
            logits = plain(torch.tensor([[*PROMPTS[0], *result.token_ids]])).logits
            actor, _ = response_head(tokens, 1.0, column.contiguous())(logits)
        assert result.logprobs == pytest.approx(actor[0].tolist(), abs=1e-5)
        # and that is not the model's own log-prob: the banned tokens' mass is gone
        own = recomputed(plain, PROMPTS[0], result.token_ids)
        assert all(a > b + 1e-4 for a, b in zip(result.logprobs, own, strict=True))


def test_concurrent_requests_each_end_once_as_they_would_alone(engine: TorchRolloutEngine) -> None:
    requests = [greedy(p, n) for p in PROMPTS for n in (1, 5, 17)]
    requests += [sampled(p, seed=i) for i, p in enumerate(PROMPTS)]
    alone = {r.request_id: engine.generate(r) for r in requests}
    with ThreadPoolExecutor(8) as pool:  # more requests than the batch of 3: some wait
        together = list(pool.map(engine.generate, requests))
    assert sorted(r.request_id for r in together) == sorted(alone)
    for result in together:
        expected = alone[result.request_id]
        assert result.token_ids == expected.token_ids
        assert result.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
        assert result.finish_reason == expected.finish_reason
    assert engine.health().in_flight == 0


def test_abort_returns_the_tokens_so_far(
    own: Callable[..., TorchRolloutEngine], plain: Any
) -> None:
    engine = own(step_delay_s=0.02)
    request = greedy(PROMPTS[0], 50)
    thread, out = in_thread(engine, request)
    time.sleep(0.15)
    assert engine.abort(request.request_id)
    result = joined(thread, out)
    assert result.finish_reason == "abort"
    assert 0 < len(result.token_ids) < 50
    assert result.token_ids == plain_greedy(plain, PROMPTS[0], len(result.token_ids))
    assert len(result.logprobs) == len(result.token_ids)
    assert not engine.abort(request.request_id)
    assert not engine.abort("never-seen")


def test_pause_holds_requests_and_abort_and_weights_still_work(
    own: Callable[..., TorchRolloutEngine], model_dir: str, tmp_path: Path
) -> None:
    engine = own()
    engine.pause()
    assert engine.health().paused
    thread, out = in_thread(engine, greedy(PROMPTS[1], 4))
    time.sleep(0.2)
    assert thread.is_alive()
    engine.resume()
    assert len(joined(thread, out).token_ids) == 4
    engine.pause()
    held = greedy(PROMPTS[1], 4)
    thread, out = in_thread(engine, held)
    assert (
        engine.load_weights(
            WeightUpdate(3, save(tmp_path / "w.safetensors", state_of(model_dir, make_certain)))
        )
        == 3
    )
    assert engine.abort(held.request_id)
    result = joined(thread, out)
    assert (result.finish_reason, result.token_ids, result.weight_version) == ("abort", (), 3)


# --- weights ---------------------------------------------------------------------------------


def test_weights_loaded_during_a_request_apply_from_its_next_token(
    own: Callable[..., TorchRolloutEngine], model_dir: str, plain: Any, tmp_path: Path
) -> None:
    engine = own(step_delay_s=0.02)
    certain = save(tmp_path / "certain.safetensors", state_of(model_dir, make_certain))
    old = plain_greedy(plain, PROMPTS[0], 40)
    thread, out = in_thread(engine, greedy(PROMPTS[0], 40))
    time.sleep(0.2)
    assert engine.load_weights(WeightUpdate(1, certain)) == 1
    result = joined(thread, out)
    assert (result.min_weight_version, result.weight_version) == (0, 1)
    assert len(result.token_ids) == 40
    # a switch point k: the old model's greedy tokens before it, the certain token after
    switches = [
        k
        for k in range(1, 40)
        if result.token_ids[:k] == old[:k]
        and set(result.token_ids[k:]) == {CERTAIN}
        and min(result.logprobs[k:]) > -1e-3
    ]
    assert switches, (result.token_ids, old)
    after = engine.generate(greedy(PROMPTS[2], 5))
    assert after.token_ids == (CERTAIN,) * 5
    assert (after.weight_version, engine.health().weight_version) == (1, 1)
    # a Hugging Face directory works too, and the same version again reloads
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    model.save_pretrained(str(tmp_path / "back"))
    assert engine.load_weights(WeightUpdate(1, str(tmp_path / "back"))) == 1
    assert engine.generate(greedy(PROMPTS[0], 40)).token_ids == old


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            lambda s: s.update({"transformer.bogus": torch.zeros(2)}),
            "1 unexpected name(s): transformer.bogus",
        ),
        (
            lambda s: s.pop("transformer.h.1.mlp.c_fc.weight"),
            "1 missing name(s): transformer.h.1.mlp.c_fc.weight",
        ),
        (
            lambda s: s.update({"transformer.wte.weight": torch.zeros(17, 64)}),
            "1 shape mismatch(es): transformer.wte.weight (17, 64) (the model's (16, 64))",
        ),
    ],
    ids=["unexpected", "missing", "shape"],
)
def test_weights_that_do_not_fit_are_refused_and_the_old_ones_kept(
    own: Callable[..., TorchRolloutEngine],
    model_dir: str,
    tmp_path: Path,
    change: Callable[[dict[str, Any]], None],
    words: str,
) -> None:
    engine = own()
    before = engine.generate(greedy(PROMPTS[0]))

    def changed(state: dict[str, torch.Tensor]) -> None:
        make_certain(state)
        change(state)

    path = save(tmp_path / "bad.safetensors", state_of(model_dir, changed))
    with pytest.raises(WeightMismatchError) as info:
        engine.load_weights(WeightUpdate(1, path))
    message = str(info.value)
    assert "tiny-gpt2: load_weights(version=1)" in message
    assert words in message
    assert engine.weight_version() == 0
    assert engine.generate(greedy(PROMPTS[0])).token_ids == before.token_ids


def test_unreadable_weights_and_old_versions_get_clear_errors(
    own: Callable[..., TorchRolloutEngine], model_dir: str, tmp_path: Path
) -> None:
    engine = own()
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    (tmp_path / "empty").mkdir()
    cases = {
        str(tmp_path / "missing.safetensors"): "no file or directory at",
        str(tmp_path / "junk.safetensors"): "is not a safetensors file",
        str(tmp_path / "empty"): "holds no *.safetensors file",
    }
    for path, words in cases.items():
        with pytest.raises(WeightLoadError, match=words.replace("*", r"\*")):
            engine.load_weights(WeightUpdate(1, path))
    with pytest.raises(WeightLoadError, match="names no path"):
        engine.load_weights(WeightUpdate(1))
    engine.load_weights(WeightUpdate(2, model_dir))
    with pytest.raises(WeightVersionError, match=r"version=1\) is below the version it holds, 2"):
        engine.load_weights(WeightUpdate(1, model_dir))
    with pytest.raises(RolloutTypeError, match=r"load_weights\(\) takes a WeightUpdate"):
        engine.load_weights(2)  # type: ignore[arg-type]
    assert engine.weight_version() == 2


# --- requests, state, configuration ----------------------------------------------------------


def test_bad_requests_get_clear_errors(engine: TorchRolloutEngine) -> None:
    with pytest.raises(PromptTooLongError) as info:
        engine.generate(greedy(range(10), 60, request_id="long"))
    assert "tiny-gpt2: request long: a prompt of 10 tokens with max_tokens=60 needs 70" in str(
        info.value
    )
    assert "the context length is 64" in str(info.value)
    with pytest.raises(RolloutRequestError, match=r"request bad: prompt token id 16 at position 1"):
        engine.generate(greedy([1, 16], request_id="bad"))
    with pytest.raises(RolloutTypeError, match=r"generate\(\) takes a GenerateRequest"):
        engine.generate([1, 2])  # type: ignore[arg-type]


def test_a_request_id_already_in_flight_is_refused(own: Callable[..., TorchRolloutEngine]) -> None:
    engine = own()
    engine.pause()
    thread, _ = in_thread(engine, greedy(PROMPTS[0], request_id="same"))
    with pytest.raises(RolloutRequestError, match=r"request id 'same' is already in flight"):
        engine.generate(greedy(PROMPTS[0], request_id="same"))
    with pytest.raises(EngineStateError, match=r"1 request\(s\) are in flight"):
        engine.sleep()
    engine.abort("same")
    thread.join(30)


def _numel(engine: TorchRolloutEngine) -> int:
    return sum(p.numel() for p in engine._model.parameters())


def test_sleep_frees_the_weights_and_wake_up_brings_them_back(
    own: Callable[..., TorchRolloutEngine], model_dir: str, tmp_path: Path
) -> None:
    engine = own()
    awake = engine.generate(greedy(PROMPTS[0]))
    full = _numel(engine)
    engine.sleep(1)
    assert engine.health().sleeping
    assert _numel(engine) == 0
    with pytest.raises(EngineStateError, match=r"while the engine sleeps; call wake_up"):
        engine.generate(greedy(PROMPTS[0]))
    engine.wake_up()
    assert _numel(engine) == full
    assert engine.generate(greedy(PROMPTS[0])).token_ids == awake.token_ids
    # level 2 at version 0 reads the model directory again
    engine.sleep(2)
    engine.wake_up()
    assert engine.generate(greedy(PROMPTS[0])).token_ids == awake.token_ids
    # weights loaded while asleep are the ones it wakes up with, at either level
    certain = save(tmp_path / "certain.safetensors", state_of(model_dir, make_certain))
    for level, version in ((1, 1), (2, 2)):
        engine.load_weights(WeightUpdate(version - 1, model_dir))
        engine.sleep(level)
        engine.load_weights(WeightUpdate(version, certain))
        assert engine.health().weight_version == version
        engine.wake_up()
        assert engine.generate(greedy(PROMPTS[0], 3)).token_ids == (CERTAIN,) * 3
    with pytest.raises(RolloutRequestError, match=r"sleep\(level\) takes 1 or 2, got 3"):
        engine.sleep(3)
    engine.close()
    with pytest.raises(EngineStateError, match=r"after close\(\)"):
        engine.generate(greedy(PROMPTS[0]))


def test_close_ends_requests_in_flight_as_aborted(own: Callable[..., TorchRolloutEngine]) -> None:
    engine = own()
    engine.pause()
    thread, out = in_thread(engine, greedy(PROMPTS[0]))
    engine.close()
    assert joined(thread, out).finish_reason == "abort"
    engine.close()  # again: nothing


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"model": ""}, "model must be a non-empty path"),
        ({"device": "tpu:x"}, "device must name a torch device"),
        ({"dtype": "bfloat16"}, "dtype must be one of ['float32']"),
        ({"seed": 1.5}, "seed must be an int"),
        ({"max_batch_size": 0}, "max_batch_size must be >= 1, got 0"),
        ({"step_delay_s": -1.0}, "step_delay_s must be a finite number >= 0"),
        ({"name": ""}, "name must be a non-empty str or None"),
    ],
)
def test_bad_configs_get_clear_errors(kwargs: dict[str, Any], words: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        TorchRolloutEngineConfig(**{"model": "m", **kwargs})
    assert f"TorchRolloutEngineConfig.{words}" in str(info.value)
    with pytest.raises(ConfigError, match="not a local Hugging Face model directory"):
        TorchRolloutEngine(TorchRolloutEngineConfig(str(tmp_path)))
    with pytest.raises(RolloutTypeError, match="takes a TorchRolloutEngineConfig, got dict"):
        TorchRolloutEngine({"model": "m"})  # type: ignore[arg-type]


# --- a server process ------------------------------------------------------------------------


@pytest.mark.slow  # a server process that imports torch and loads the model: 15 s here
def test_a_server_process_answers_as_the_engine_does(
    engine: TorchRolloutEngine, model_dir: str
) -> None:
    config = TorchRolloutEngineConfig(model_dir, name="served", max_batch_size=2)
    argv = torch_engine_argv(config, "127.0.0.1", 0)
    assert argv[1:4] == ["-m", "sc_workers.rollout", "--model"]
    with ServerProcess(argv, start_timeout_s=90) as server:
        client = RolloutClient(server.url)
        for request in (greedy(PROMPTS[0], 16), sampled(PROMPTS[2], seed=5)):
            remote = client.generate(request)
            local = engine.generate(request)
            assert remote.token_ids == local.token_ids
            assert remote.logprobs == pytest.approx(local.logprobs, abs=1e-6)
            assert remote.server == server.url
        health = client.health()
        assert (health.model, health.context_length, health.weight_version) == ("served", 64, 0)
        with pytest.raises(PromptTooLongError, match="the context length is 64"):
            client.generate(greedy(range(10), 60))


def test_the_exact_mode_reports_the_actors_log_probs_bit_for_bit(
    own: Callable[..., TorchRolloutEngine], model_dir: str
) -> None:
    """With ``exact_window`` the engine's log-probs of concurrent, batched requests equal an
    actor's recomputation in the same window (``window_forward``), exactly."""
    window = 40
    engine = own(exact_window=window, max_batch_size=3)
    requests = [
        GenerateRequest(prompt, SamplingParams(max_tokens=10, temperature=0.8, seed=i))
        for i, prompt in enumerate([*PROMPTS, *PROMPTS])
    ]
    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(engine.generate, requests))
    actor = load_hf_model(model_dir, False, torch.float32)
    for request, result in zip(requests, results, strict=True):
        tokens = [*request.prompt_ids, *result.token_ids]
        ids, mask, positions = (t[:, : len(tokens)] for t in window_row(tokens, window, "test"))
        with torch.no_grad():
            logits = window_forward(actor, ids, mask, positions, window, "test")[0].float()
        logprobs = torch.log_softmax(logits / 0.8, dim=-1)
        prompt = len(request.prompt_ids)
        expected = [float(logprobs[prompt - 1 + i, t]) for i, t in enumerate(result.token_ids)]
        assert list(result.logprobs) == expected
    with pytest.raises(ConfigError, match="exact_window must be >= 0, got -1"):
        TorchRolloutEngineConfig(model_dir, exact_window=-1)
    assert "--exact-window" in torch_engine_argv(
        TorchRolloutEngineConfig(model_dir, exact_window=9)
    )
