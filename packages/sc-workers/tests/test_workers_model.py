"""The built-in transformer, the sampler's filters, and the engine at world size 1."""

from __future__ import annotations

import sys

import pytest
import torch
from sc_workers import (
    BatchError,
    ConfigError,
    DistributedError,
    FSDPConfig,
    ModelConfig,
    NotInitializedError,
    OptimConfig,
    OptionalDependencyError,
    ParallelLayout,
    TinyCausalLM,
    make_engine,
)
from sc_workers.engine import init_distributed, resolve_device
from sc_workers.models import KVCache, load_hf_model
from sc_workers.workers import filter_logits


def _model(**kw: object) -> TinyCausalLM:
    torch.manual_seed(0)
    return TinyCausalLM(ModelConfig(**kw))  # type: ignore[arg-type]


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.randint(2, 32, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_kv_cache_matches_full_forward() -> None:
    model = _model()
    ids, mask, pos = _inputs()
    with torch.no_grad():
        full = model(ids, mask, pos)
        cache = KVCache(2)
        parts = [model(ids[:, :4], mask[:, :4], pos[:, :4], cache)]
        for i in (4, 5):
            parts.append(model(ids[:, i : i + 1], mask[:, : i + 1], pos[:, i : i + 1], cache))
    assert cache.length == 6
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


def test_left_padding_does_not_change_valid_logits() -> None:
    model = _model()
    ids, mask, pos = _inputs()
    with torch.no_grad():
        padded = model(ids, mask, pos)[0, 2:]
        unpadded = model(ids[:1, 2:], mask[:1, 2:], pos[:1, 2:])[0]
    torch.testing.assert_close(padded, unpadded, atol=1e-5, rtol=1e-5)


def test_causality() -> None:
    model = _model()
    ids, mask, pos = _inputs()
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 32
    with torch.no_grad():
        a, b = model(ids, mask, pos), model(changed, mask, pos)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_value_head_tied_embeddings_and_bad_mask() -> None:
    ids, mask, pos = _inputs()
    critic = TinyCausalLM(ModelConfig(), value_head=True)
    assert critic(ids, mask, pos).shape == (2, 6)
    tied = TinyCausalLM(ModelConfig(tie_word_embeddings=True))
    assert tied.lm_head.weight is tied.embed_tokens.weight
    with pytest.raises(BatchError, match=r"attention_mask shape \(2, 5\) does not match batch 2"):
        critic(ids, mask[:, :5], pos)


def test_value_head_starts_at_zero() -> None:
    ids, mask, pos = _inputs()
    torch.manual_seed(0)
    critic = TinyCausalLM(ModelConfig(), value_head=True)
    assert torch.equal(critic(ids, mask, pos), torch.zeros(2, 6))
    assert critic.lm_head.weight.abs().sum() == 0
    # the body is still random: a policy built from the same seed is not zero
    assert _model()(ids, mask, pos).abs().sum() > 0


def test_absolute_positions_cache_padding_and_shift() -> None:
    rope_only, absolute = _model(), _model(absolute_position_embeddings=True)
    assert rope_only.embed_positions is None
    assert absolute.embed_positions is not None
    assert absolute.embed_positions.weight.shape == (2048, 32)
    ids, mask, pos = _inputs()
    with torch.no_grad():
        full = absolute(ids, mask, pos)
        cache = KVCache(2)
        parts = [absolute(ids[:, :4], mask[:, :4], pos[:, :4], cache)]
        for i in (4, 5):
            parts.append(absolute(ids[:, i : i + 1], mask[:, : i + 1], pos[:, i : i + 1], cache))
        torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)
        unpadded = absolute(ids[:1, 2:], mask[:1, 2:], pos[:1, 2:])[0]
        torch.testing.assert_close(full[0, 2:], unpadded, atol=1e-5, rtol=1e-5)
        # rotary attention sees only distances: shifting every position changes nothing;
        # the absolute table makes the model see where a token is
        torch.testing.assert_close(rope_only(ids, mask, pos + 3), rope_only(ids, mask, pos))
        assert not torch.allclose(absolute(ids, mask, pos + 3), full)


def test_absolute_positions_beyond_the_table() -> None:
    model = _model(absolute_position_embeddings=True, max_position_embeddings=8)
    ids, mask, pos = _inputs()
    model(ids, mask, pos + 2)  # positions up to 7 fit
    with pytest.raises(BatchError, match=r"position 8 is beyond .*max_position_embeddings 8"):
        model(ids, mask, pos + 3)


def test_absolute_positions_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"absolute_position_embeddings must be a bool, got 1"):
        ModelConfig(absolute_position_embeddings=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"built-in model; the Hugging Face model at path='m'"):
        ModelConfig(path="m", absolute_position_embeddings=True)


def test_seeded_init_is_reproducible() -> None:
    torch.manual_seed(3)
    a = TinyCausalLM(ModelConfig())
    torch.manual_seed(3)
    b = TinyCausalLM(ModelConfig())
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_filter_logits_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    top2 = filter_logits(logits, top_k=2, top_p=1.0)
    assert torch.isinf(top2).tolist() == [[False, False, True]]
    # mass before each token: 0, 0.5, 0.8
    assert torch.isinf(filter_logits(logits, 0, 0.5)).tolist() == [[False, True, True]]
    assert torch.isinf(filter_logits(logits, 0, 0.6)).tolist() == [[False, False, True]]
    # the most likely token always survives
    assert torch.isinf(filter_logits(logits, 0, 1e-9)).tolist() == [[False, True, True]]
    # unsorted input: the mask follows the tokens
    shuffled = logits[:, [2, 0, 1]]
    assert torch.isinf(filter_logits(shuffled, 0, 0.6)).tolist() == [[True, False, False]]


def _engine(optim: bool = True) -> object:
    engine = make_engine(
        "fsdp",
        ModelConfig(seed=11),
        FSDPConfig(param_dtype="float32"),
        ParallelLayout.create(1, 0),
        torch.device("cpu"),
        OptimConfig(lr=0.1, lr_warmup_steps=2) if optim else None,
    )
    engine.build()
    return engine


def test_engine_grad_clipping_matches_torch() -> None:
    from sc_workers import Engine

    engine = _engine()
    assert isinstance(engine, Engine)
    ids, mask, pos = _inputs()
    torch.manual_seed(11)  # the engine builds its model under the config's seed
    reference = TinyCausalLM(ModelConfig(seed=11))
    torch.autograd.backward(engine.forward(ids, mask, pos).pow(2).mean())
    torch.autograd.backward(reference(ids, mask, pos).pow(2).mean())
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm=1e-3)
    norm = engine.clip_grad_norm(1e-3)
    assert norm == pytest.approx(expected.item(), rel=1e-5)
    # after clipping, the global norm is the bound
    assert engine.clip_grad_norm(1e9) == pytest.approx(1e-3, rel=1e-4)
    assert engine.get_lr() == pytest.approx(0.05)  # warmup step 1 of 2
    engine.optimizer_step(1.0)
    assert engine.lr_scheduler_step() == pytest.approx(0.1)
    assert engine.get_data_parallel_rank() == 0
    assert engine.get_data_parallel_size() == 1
    assert engine.is_mp_src_rank_with_outputs()
    # offloading is a no-op on CPU, and the engine still works
    engine.offload_params()
    engine.offload_optimizer()
    with engine.on_device(with_optimizer=True):
        assert engine.forward(ids, mask, pos).shape == (2, 6, 32)


def test_engine_errors() -> None:
    from sc_workers import Engine

    inference = _engine(optim=False)
    assert isinstance(inference, Engine)
    with pytest.raises(NotInitializedError, match="built without an optimizer"):
        inference.zero_grad()
    unbuilt = make_engine(
        "megatron", ModelConfig(), FSDPConfig(), ParallelLayout.create(1, 0), torch.device("cpu")
    )
    with pytest.raises(NotInitializedError, match="megatron engine is not built"):
        unbuilt.forward(*_inputs())
    with pytest.raises(ConfigError, match="got 'ddp'"):
        make_engine(
            "ddp", ModelConfig(), FSDPConfig(), ParallelLayout.create(1, 0), torch.device("cpu")
        )
    with pytest.raises(DistributedError, match="already initialised as rank 0 of world size 1"):
        init_distributed(2, 1, torch.device("cpu"), "127.0.0.1", "1")


def test_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_device("cpu", {}) == torch.device("cpu")
    assert resolve_device("auto", {"SC_WORKERS_DEVICE": "cpu"}) == torch.device("cpu")
    with pytest.raises(ConfigError, match="got 'tpu'"):
        resolve_device("auto", {"SC_WORKERS_DEVICE": "tpu"})
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"torch\.cuda\.is_available"):
            resolve_device("cuda", {})


def test_hf_model_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes the import fail
    with pytest.raises(OptionalDependencyError, match=r"install sc-workers\[hf\]"):
        load_hf_model("/nowhere", value_head=False, dtype=torch.float32)
    with pytest.raises(ImportError):
        load_hf_model("/nowhere", value_head=False, dtype=torch.float32)
