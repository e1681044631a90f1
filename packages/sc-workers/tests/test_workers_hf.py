"""The optional Hugging Face extra: a tiny local model, built from a config (no download)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from _workers_helpers import RESP_LEN, actor_config, col, critic_config, make_tensors, proto
from sc_workers import ActorRolloutRefWorker, CriticWorker

transformers: Any = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hf") / "tiny-llama"
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


def test_actor_and_critic_on_a_local_hf_model(
    hf_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    cfg = actor_config()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=hf_path))
    actor = ActorRolloutRefWorker(cfg, "actor_rollout_ref")
    actor.init_model()
    t = make_tensors(8)
    lp = col(actor.compute_log_prob(proto(t)), "old_log_probs")
    ref = col(actor.compute_ref_log_prob(proto(t)), "ref_log_prob")
    torch.testing.assert_close(lp, ref)
    assert lp.shape == (8, RESP_LEN)
    metrics = actor.update_actor(proto(t)).meta_info["metrics"]
    assert metrics["actor/grad_norm"] > 0
    gen_in = {k: t[k][:, :-RESP_LEN] for k in ("input_ids", "attention_mask", "position_ids")}
    out = actor.generate_sequences(proto(gen_in, response_length=3))
    assert col(out, "responses").shape == (8, 3)
    ccfg = critic_config()
    critic = CriticWorker(
        dataclasses.replace(ccfg, model=dataclasses.replace(ccfg.model, path=hf_path))
    )
    critic.init_model()
    assert col(critic.compute_values(proto(t)), "values").shape == (8, RESP_LEN)


def test_local_path_only(tmp_path: Path) -> None:
    from sc_workers.models import load_hf_model

    with pytest.raises(OSError):  # noqa: PT011 - transformers' own error type varies by version
        load_hf_model(str(tmp_path / "missing"), value_head=False, dtype=torch.float32)
