"""The vLLM engine against the trainer's model (the ``vllm`` nox session; marked ``vllm``).

One vLLM server process serves a tiny GPT-2 built here for the whole module (vLLM takes a
minute to start on two cores). The trainer's side is sc-workers' Hugging Face model, loaded
through its real loading code. Checked: greedy outputs equal the trainer model's token for
token at the initial weights and after each of three weight pushes (the trainer model is
trained a little between pushes, so the outputs change); the log-probs of sampled tokens
match the trainer's recomputation; a three-turn agent session with tool tokens between the
turns sends the engine the session's sequence so far at each turn, and its model tokens'
log-probs match the trainer's recomputation over the whole sequence; an update during a
request shows in its version span; and the errors of a bad push, a long prompt and a model
vLLM cannot serve.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from sc_rollout import (
    AgentSession,
    GenerateRequest,
    GenerateResult,
    RolloutClient,
    SamplingParams,
    ServerProcess,
    Turn,
    VLLMEngineConfig,
    WeightUpdate,
)
from sc_rollout.agents import AppendedTokens
from sc_rollout.engines._vllm_env import default_flavor as default_vllm_flavor
from sc_rollout.errors import PromptTooLongError, UnservableModelError, WeightMismatchError
from sc_trainer.tasks import save_tiny_gpt2
from sc_workers.models import load_hf_model, save_hf_model

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

log = logging.getLogger(__name__)

CONTEXT = 128
#: prompts of the digit task's tokens (3..13), different lengths
PROMPTS = [[2, *(3 + (i * 7 + j * 3) % 10 for j in range(3 + i % 4)), 13] for i in range(12)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_gpt2(tmp_path_factory.mktemp("vllm") / "tiny-gpt2", context=CONTEXT)


@pytest.fixture(scope="module")
def refused_starts(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Future[ServerProcess]]]:
    """The starts of models vLLM cannot serve, by the reason its error must name. Each is a
    vLLM process that imports vLLM before it fails (half a minute of one core here), so they
    begin before the module's server and run on the core its start leaves idle."""
    folder = tmp_path_factory.mktemp("unservable")
    alien = Path(save_tiny_gpt2(folder / "alien"))
    config = json.loads((alien / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (alien / "config.json").write_text(json.dumps(config))
    models = {"NoSuchModelForCausalLM": str(alien)}
    if default_vllm_flavor() == "cpu":  # vLLM's CUDA attention takes heads of 16
        narrow = save_tiny_gpt2(folder / "narrow-heads", num_heads=4)  # heads of width 16
        models["attention heads of size 16"] = narrow
    pool = ThreadPoolExecutor(max_workers=len(models))
    starts = {
        reason: pool.submit(ServerProcess.vllm, VLLMEngineConfig(model=model))
        for reason, model in models.items()
    }
    try:
        yield starts
    finally:
        pool.shutdown(wait=True)
        for start in starts.values():  # one that started after all is not left running
            if start.exception() is None:
                start.result().stop()


@pytest.fixture(scope="module")
def server(
    model_dir: str, refused_starts: dict[str, Future[ServerProcess]]
) -> Iterator[ServerProcess]:
    # refused_starts: begun first, beside this start (see there)
    started = time.perf_counter()
    with ServerProcess.vllm(VLLMEngineConfig(model=model_dir, seed=0)) as process:
        log.warning("vLLM server ready in %.0f s", time.perf_counter() - started)
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> RolloutClient:
    return RolloutClient(server.url)


@pytest.fixture(scope="module")
def trainer_model(model_dir: str) -> Any:
    model = load_hf_model(model_dir, value_head=False, dtype=torch.float32)
    model.eval()
    return model


def _logits(model: Any, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids])
    mask = torch.ones_like(x)
    pos = torch.arange(len(ids))[None, :]
    with torch.no_grad():
        out: torch.Tensor = model(x, mask, pos)
    return out[0].float()


def _greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(_logits(model, ids)[-1].argmax()))
    return ids[len(prompt) :]


def _engine_greedy(client: RolloutClient, prompt: list[int], n: int) -> GenerateResult:
    sampling = SamplingParams(max_tokens=n, temperature=0.0)
    return client.generate(GenerateRequest(prompt_ids=prompt, sampling=sampling))


def _train_a_little(model: Any, steps: int, seed: int) -> None:
    """A few optimizer steps towards answering each prompt with its digits reversed, so the
    greedy outputs move."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        prompt = PROMPTS[int(torch.randint(len(PROMPTS), (1,), generator=gen))]
        target = [*reversed(prompt[1:-1]), 1]
        ids = prompt + target
        logits = _logits_train(model, ids)
        loss = torch.nn.functional.cross_entropy(logits[len(prompt) - 1 : -1], torch.tensor(target))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    model.eval()


def _logits_train(model: Any, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids])
    out: torch.Tensor = model(x, torch.ones_like(x), torch.arange(len(ids))[None, :])
    return out[0]


def _push(client: RolloutClient, model: Any, model_dir: str, out: Path, version: int) -> None:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    save_hf_model(state, "causal_lm", model_dir, out)
    assert client.load_weights(WeightUpdate(version=version, path=str(out))) == version


def test_banned_tokens_are_never_sampled(client: RolloutClient) -> None:
    """An agent's tool budget (``banned_token_ids``) holds on vLLM, greedy and sampled."""
    free = _engine_greedy(client, PROMPTS[0], 6)
    banned = sorted(set(free.token_ids))
    for temperature, seed in ((0.0, None), (1.0, 5), (1.0, 6)):
        sampling = SamplingParams(
            max_tokens=6, temperature=temperature, seed=seed, banned_token_ids=banned
        )
        result = client.generate(GenerateRequest(PROMPTS[0], sampling))
        assert len(result.token_ids) == 6
        assert not set(result.token_ids) & set(banned), (temperature, result.token_ids)


def test_greedy_outputs_equal_the_trainer_models_after_three_weight_pushes(
    client: RolloutClient, trainer_model: Any, model_dir: str, tmp_path: Path
) -> None:
    seen: list[list[list[int]]] = []
    for version in range(4):
        if version:
            _train_a_little(trainer_model, steps=40, seed=version)
            _push(client, trainer_model, model_dir, tmp_path / f"v{version}", version)
        expected = [_greedy(trainer_model, p, 8) for p in PROMPTS]
        results = [_engine_greedy(client, p, 8) for p in PROMPTS]
        got = [list(r.token_ids) for r in results]
        assert got == expected, f"version {version}"
        assert {r.weight_version for r in results} == {version}
        seen.append(got)
    assert len({json.dumps(s) for s in seen}) == 4, "every push changed the greedy outputs"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_match_the_trainers_recomputation(
    client: RolloutClient, trainer_model: Any, temperature: float
) -> None:
    """The engine reports log-probs after temperature (vLLM's processed log-probs), as the
    actor recomputes them: ``log_softmax(logits / temperature)``."""
    diffs: list[float] = []
    for i, prompt in enumerate(PROMPTS):
        sampling = SamplingParams(max_tokens=12, temperature=temperature, seed=100 + i)
        result = client.generate(GenerateRequest(prompt_ids=prompt, sampling=sampling))
        logits = _logits(trainer_model, prompt + list(result.token_ids))
        logp = torch.log_softmax(logits / temperature, dim=-1)
        for j, (token, lp) in enumerate(zip(result.token_ids, result.logprobs, strict=True)):
            diffs.append(abs(float(logp[len(prompt) - 1 + j, token]) - lp))
    mean, worst = sum(diffs) / len(diffs), max(diffs)
    log.warning(
        "vLLM vs trainer log-probs: mean |diff| %.2e, max %.2e over %d tokens",
        mean,
        worst,
        len(diffs),
    )
    assert mean <= 1e-3, f"mean |diff| {mean:.2e} (max {worst:.2e})"


class _RecordingClient(RolloutClient):
    """The module's server, recording every request before it is sent."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.requests: list[GenerateRequest] = []

    def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        return super().generate(request)


#: the tool answers appended after the first and the second turn
TOOL_TOKENS = [(12, 4, 7), (13, 9)]


def _three_turn_session(
    url: str, prompt: list[int], sampling: SamplingParams
) -> tuple[AgentSession, list[GenerateRequest], list[tuple[int, ...]]]:
    """Three model turns with the tool tokens appended between them; the requests the
    engine got, and the session's whole sequence before each turn."""
    engine = _RecordingClient(url)
    before: list[tuple[int, ...]] = []
    with AgentSession(engine, prompt, sampling=sampling) as session:
        for k in range(3):
            before.append(session.token_ids)
            session.generate()
            if k < len(TOOL_TOKENS):
                session.append_tokens(TOOL_TOKENS[k])
    return session, engine.requests, before


def _check_session_sequence(
    session: AgentSession, requests: list[GenerateRequest], before: list[tuple[int, ...]]
) -> None:
    """Each request is the session's sequence so far; the segments tile the response."""
    turns = session.turns
    assert len(turns) == len(requests) == 3
    prompt, response = session.prompt_ids, session.response_ids
    for turn, request, seen in zip(turns, requests, before, strict=True):
        assert request.prompt_ids == seen == prompt + response[: turn.start]
        assert request.request_id == turn.request_id
        assert request.session_id == session.session_id
        assert len(turn.token_ids) == request.sampling.max_tokens  # vLLM ignores eos here
    mask = session.response_mask
    assert len(mask) == len(response) == len(session.response_logprobs)
    tiled: list[int] = []
    for segment in session.segments:
        assert segment.start == len(tiled)
        tiled.extend(segment.token_ids)
        model_token = isinstance(segment, Turn)
        assert mask[segment.start : len(tiled)] == (int(model_token),) * len(segment.token_ids)
    assert tuple(tiled) == response
    appended = [s.token_ids for s in session.segments if isinstance(s, AppendedTokens)]
    assert appended == TOOL_TOKENS
    assert session.token_ids == prompt + response


def _session_logprob_diffs(model: Any, session: AgentSession, greedy: bool) -> list[float]:
    """|engine - trainer| log-prob of each model token, the trainer's from one forward over
    the whole sequence; tool tokens have log-prob 0.0. Greedy: each model token is the
    argmax of that forward."""
    prompt = session.prompt_ids
    logp = torch.log_softmax(_logits(model, list(session.token_ids)), dim=-1)
    diffs: list[float] = []
    for i, (token, masked, lp) in enumerate(
        zip(session.response_ids, session.response_mask, session.response_logprobs, strict=True)
    ):
        row = logp[len(prompt) - 1 + i]
        if not masked:
            assert lp == 0.0
            continue
        diffs.append(abs(float(row[token]) - lp))
        if greedy:
            assert token == int(row.argmax()), f"model token {i} is not the trainer's argmax"
    return diffs


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
def test_multi_turn_sessions_keep_token_and_log_prob_parity(
    server: ServerProcess, trainer_model: Any, temperature: float
) -> None:
    diffs: list[float] = []
    for i, prompt in enumerate(PROMPTS[:4]):
        sampling = SamplingParams(max_tokens=5, temperature=temperature, seed=300 + i)
        session, requests, before = _three_turn_session(server.url, prompt, sampling)
        _check_session_sequence(session, requests, before)
        diffs.extend(_session_logprob_diffs(trainer_model, session, greedy=temperature == 0.0))
    assert len(diffs) == 4 * 3 * 5
    mean, worst = sum(diffs) / len(diffs), max(diffs)
    log.warning(
        "multi-turn (temperature %g) vLLM vs trainer log-probs: mean |diff| %.2e, max %.2e "
        "over %d model tokens",
        temperature,
        mean,
        worst,
        len(diffs),
    )
    assert mean <= 1e-3, f"mean |diff| {mean:.2e} (max {worst:.2e})"


def test_a_weight_update_during_a_request_shows_in_its_version_span(
    client: RolloutClient, trainer_model: Any, model_dir: str, tmp_path: Path
) -> None:
    version = client.weight_version() + 1
    state = {k: v.detach().clone() for k, v in trainer_model.state_dict().items()}
    save_hf_model(state, "causal_lm", model_dir, tmp_path / "next")
    results: list[GenerateResult] = []
    request = GenerateRequest(
        prompt_ids=PROMPTS[0], sampling=SamplingParams(max_tokens=CONTEXT - len(PROMPTS[0]))
    )
    worker = threading.Thread(target=lambda: results.append(client.generate(request)))
    client.pause()
    worker.start()
    try:
        # the request is queued behind the pause: let it produce tokens, then update
        client.resume()
        time.sleep(0.05)
        client.load_weights(WeightUpdate(version=version, path=str(tmp_path / "next")))
    finally:
        worker.join(60)
    (result,) = results
    assert result.finish_reason == "length"
    assert result.weight_version == version
    assert result.min_weight_version == version - 1


def test_a_push_whose_names_or_shapes_differ_is_refused_and_nothing_changes(
    client: RolloutClient, trainer_model: Any, model_dir: str, tmp_path: Path
) -> None:
    before = client.weight_version()
    greedy = [list(_engine_greedy(client, p, 6).token_ids) for p in PROMPTS[:4]]
    state = {k: v.detach().clone() for k, v in trainer_model.state_dict().items()}
    renamed = dict(state)
    name = next(k for k in renamed if k.endswith("ln_f.weight"))
    renamed[name.replace("ln_f", "ln_g")] = renamed.pop(name)
    save_hf_model_raw(renamed, tmp_path / "renamed")
    with pytest.raises(WeightMismatchError, match=r"missing: transformer\.ln_f\.weight"):
        client.load_weights(WeightUpdate(version=before + 1, path=str(tmp_path / "renamed")))
    wide = dict(state)
    wte = next(k for k in wide if k.endswith("wte.weight"))
    wide[wte] = torch.zeros(wide[wte].shape[0] + 1, wide[wte].shape[1])
    save_hf_model_raw(wide, tmp_path / "wide")
    with pytest.raises(WeightMismatchError, match=r"wrong shape: transformer\.wte\.weight"):
        client.load_weights(WeightUpdate(version=before + 1, path=str(tmp_path / "wide")))
    assert client.weight_version() == before
    assert [list(_engine_greedy(client, p, 6).token_ids) for p in PROMPTS[:4]] == greedy


def save_hf_model_raw(state: dict[str, torch.Tensor], out: Path) -> None:
    """The trainer's names without the wrapper's ``model.`` prefix, as a safetensors file."""
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    hf = {k.removeprefix("model."): v.contiguous() for k, v in state.items()}
    hf.pop("lm_head.weight", None)  # tied to wte, as save_pretrained leaves it out
    save_file(hf, str(out / "model.safetensors"))


def test_a_prompt_longer_than_the_context_is_refused(client: RolloutClient) -> None:
    sampling = SamplingParams(max_tokens=8)
    with pytest.raises(PromptTooLongError, match=rf"exceed the context of {CONTEXT}"):
        client.generate(GenerateRequest(prompt_ids=[3] * (CONTEXT - 4), sampling=sampling))


def test_a_model_vllm_cannot_serve_is_named_with_the_reason(
    refused_starts: dict[str, Future[ServerProcess]],
) -> None:
    for reason, start in refused_starts.items():
        with pytest.raises(UnservableModelError, match=reason):
            start.result().stop()
