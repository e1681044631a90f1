"""Configuration validation: every rule, with the numbers in the message."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sc_workers import (
    ActorConfig,
    ActorRolloutRefConfig,
    ConfigError,
    CriticConfig,
    FSDPConfig,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
    ParallelSizes,
    RefConfig,
    RolloutConfig,
)
from sc_workers.engine import ParallelLayout, warmup_lr_lambda


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (
            lambda: ModelConfig(hidden_size=30),
            "hidden_size 30 is not divisible by num_attention_heads 4",
        ),
        (lambda: ModelConfig(hidden_size=12, num_attention_heads=4), "head dim 3"),
        (lambda: ModelConfig(vocab_size=0), "vocab_size must be a positive number, got 0"),
        (lambda: ModelConfig(eos_token_id=40), "eos_token_id 40 is outside [0, vocab_size 32)"),
        (lambda: ModelConfig(dtype="int8"), "dtype must be one of"),  # type: ignore[arg-type]
        (lambda: OptimConfig(lr=-1.0), "lr must be >= 0, got -1.0"),
        (lambda: OptimConfig(betas=(0.9, 1.0)), "betas must be two numbers in [0, 1)"),
        (lambda: OptimConfig(warmup_style="cosine"), "total_training_steps must be set"),
        (lambda: OptimConfig(lr_warmup_steps_ratio=0.1), "total_training_steps must be set"),
        (lambda: OptimConfig(min_lr_ratio=2.0), "min_lr_ratio must be in [0, 1], got 2.0"),
        (lambda: FSDPConfig(fsdp_size=0), "fsdp_size must be -1 or a positive int, got 0"),
        (lambda: FSDPConfig(param_dtype="fp8"), "param_dtype must be one of"),  # type: ignore[arg-type]
        (lambda: ActorConfig(ppo_epochs=0), "ppo_epochs must be a positive number, got 0"),
        (lambda: ActorConfig(clip_ratio_c=1.0), "clip_ratio_c must be > 1.0 (dual clip), got 1.0"),
        (lambda: ActorConfig(loss_agg_mode="sum"), "loss_agg_mode must be one of"),  # type: ignore[arg-type]
        (lambda: ActorConfig(kl_loss_type="full"), "kl_loss_type must be one of"),
        (lambda: ActorConfig(strategy="ddp"), "strategy must be one of"),  # type: ignore[arg-type]
        (
            lambda: ActorConfig(megatron=MegatronConfig(tensor_model_parallel_size=2)),
            "tensor_model_parallel_size 2 needs strategy 'megatron', got 'fsdp'",
        ),
        (lambda: RolloutConfig(top_p=0.0), "top_p must be in (0, 1], got 0.0"),
        (lambda: RolloutConfig(temperature=0), "temperature must be a positive number, got 0"),
        (lambda: RefConfig(log_prob_micro_batch_size_per_gpu=0), "got 0"),
        (lambda: CriticConfig(cliprange_value=-0.1), "cliprange_value must be a positive number"),
        (lambda: CriticConfig(device="tpu"), "device must be one of"),  # type: ignore[arg-type]
        (
            lambda: CriticConfig(
                strategy="megatron", megatron=MegatronConfig(tensor_model_parallel_size=3)
            ),
            "num_attention_heads 4 is not divisible by tensor_model_parallel_size 3",
        ),
        (
            lambda: CriticConfig(
                model=ModelConfig(intermediate_size=66),
                strategy="megatron",
                megatron=MegatronConfig(tensor_model_parallel_size=4),
            ),
            "intermediate_size 66 is not divisible by tensor_model_parallel_size 4",
        ),
        (
            lambda: ActorRolloutRefConfig(
                actor=ActorConfig(
                    strategy="megatron", megatron=MegatronConfig(tensor_model_parallel_size=2)
                )
            ),
            "parallel sizes ParallelSizes(tp=2, pp=1, sp=1, vpp=1) differ from the ref's",
        ),
    ],
)
def test_invalid_values_raise_config_error(factory: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        factory()


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig(hidden_size=30)


def test_pipeline_schedule_follows_virtual_stages() -> None:
    assert MegatronConfig(pipeline_model_parallel_size=2).schedule == "1F1B"
    interleaved = MegatronConfig(
        pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2
    )
    assert interleaved.schedule == "Interleaved1F1B"
    assert interleaved.virtual_stages == 2
    gpipe = MegatronConfig(pipeline_model_parallel_size=2, pipeline_schedule="GPipe")
    assert gpipe.schedule == "GPipe"
    with pytest.raises(ConfigError, match="needs pipeline_model_parallel_size > 1"):
        MegatronConfig(virtual_pipeline_model_parallel_size=2)
    with pytest.raises(ConfigError, match="'GPipe' runs one stage per rank"):
        MegatronConfig(
            pipeline_model_parallel_size=2,
            virtual_pipeline_model_parallel_size=2,
            pipeline_schedule="GPipe",
        )
    with pytest.raises(ConfigError, match="'Interleaved1F1B' needs virtual"):
        MegatronConfig(pipeline_model_parallel_size=2, pipeline_schedule="Interleaved1F1B")
    with pytest.raises(ConfigError, match="pipeline_schedule must be one of"):
        MegatronConfig(pipeline_schedule="zero-bubble")  # type: ignore[arg-type]  # bad on purpose


def test_parallel_sizes_need_their_strategy() -> None:
    with pytest.raises(ConfigError, match="pipeline_model_parallel_size 2 needs strategy"):
        ActorConfig(megatron=MegatronConfig(pipeline_model_parallel_size=2))
    with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size 2 is a feature of"):
        ActorConfig(strategy="megatron", ulysses_sequence_parallel_size=2)
    with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size must be a positive"):
        CriticConfig(ulysses_sequence_parallel_size=0)
    assert ActorConfig(ulysses_sequence_parallel_size=2).parallel_sizes == ParallelSizes(sp=2)
    megatron = MegatronConfig(
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=2,
    )
    assert ActorConfig(strategy="megatron", megatron=megatron).parallel_sizes == ParallelSizes(
        tp=2, pp=2, vpp=2
    )
    with pytest.raises(ConfigError, match="the actor's parallel sizes"):
        ActorRolloutRefConfig(
            actor=ActorConfig(strategy="megatron", megatron=megatron),
            ref=RefConfig(strategy="megatron"),
        )


def test_a_hugging_face_model_brings_its_own_architecture() -> None:
    # head counts live in the directory's config.json: checked when it is read, not here
    critic = CriticConfig(
        model=ModelConfig(path="/models/x", hidden_size=30, num_attention_heads=7),
        strategy="megatron",
        megatron=MegatronConfig(tensor_model_parallel_size=2),
    )
    assert critic.model.path == "/models/x"


def test_several_eos_tokens() -> None:
    assert ModelConfig(eos_token_id=(1, 3)).eos_token_ids == (1, 3)
    assert ModelConfig(eos_token_id=[1, 3]).eos_token_id == (1, 3)  # type: ignore[arg-type]
    assert ModelConfig().eos_token_ids == (1,)
    assert ModelConfig.from_dict({"eos_token_id": [2, 5]}).eos_token_id == (2, 5)
    with pytest.raises(ConfigError, match=re.escape("eos_token_id 40 is outside")):
        ModelConfig(eos_token_id=(1, 40))
    with pytest.raises(ConfigError, match=re.escape("must name at least one token, got ()")):
        ModelConfig(eos_token_id=())
    with pytest.raises(ConfigError, match="eos_token_id must be an int, got '1'"):
        ModelConfig(eos_token_id=("1",))  # type: ignore[arg-type]


def test_batch_sizes_normalised_by_dp() -> None:
    sizes = ActorConfig(
        ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2
    ).normalized_batch_sizes(rollout_n=2, dp_size=2)
    assert (sizes.mini_batch_size, sizes.micro_batch_size, sizes.grad_accumulation) == (4, 2, 2)
    critic = CriticConfig(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=1, rollout_n=1)
    assert critic.normalized_batch_sizes(4).mini_batch_size == 2


def test_batch_sizes_not_divisible() -> None:
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "ppo_mini_batch_size 6 (x rollout n 1 = 6 sequences) is not divisible by dp size 4"
        ),
    ):
        ActorConfig(ppo_mini_batch_size=6).normalized_batch_sizes(rollout_n=1, dp_size=4)
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "per-rank mini-batch 2 (ppo_mini_batch_size 4 x n 1 / dp size 2) is not "
            "divisible by ppo_micro_batch_size_per_gpu 3"
        ),
    ):
        ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=3).normalized_batch_sizes(
            1, 2
        )


def test_from_dict_builds_nested_sections() -> None:
    cfg = ActorRolloutRefConfig.from_dict(
        {
            "model": {"vocab_size": 64},
            "actor": {"ppo_mini_batch_size": 8, "optim": {"lr": 0.1, "betas": [0.8, 0.9]}},
            "rollout": {"n": 2, "temperature": 0.7},
            "device": "cpu",
        }
    )
    assert cfg.model.vocab_size == 64
    assert cfg.actor.optim.betas == (0.8, 0.9)
    assert cfg.actor.ppo_mini_batch_size == 8
    assert cfg.rollout.n == 2
    assert ActorRolloutRefConfig.from_dict(cfg.to_dict()) == cfg


def test_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ConfigError, match=r"actor: unknown keys \['ppo_mini_batch'\]"):
        ActorRolloutRefConfig.from_dict({"actor": {"ppo_mini_batch": 8}})
    with pytest.raises(ConfigError, match="expected a mapping, got list"):
        CriticConfig.from_dict([1, 2])  # type: ignore[arg-type]


def test_warmup_then_constant_and_cosine() -> None:
    constant = warmup_lr_lambda(OptimConfig(lr_warmup_steps=4))
    assert [constant(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = warmup_lr_lambda(
        OptimConfig(
            lr_warmup_steps=2, warmup_style="cosine", total_training_steps=6, min_lr_ratio=0.1
        )
    )
    # after warmup: progress (s - 2) / 4; 0.1 + 0.9 * 0.5 * (1 + cos(pi * progress))
    assert cosine(2) == pytest.approx(1.0)
    assert cosine(4) == pytest.approx(0.55)
    assert cosine(6) == pytest.approx(0.1)
    assert cosine(99) == pytest.approx(0.1)
    ratio = OptimConfig(lr_warmup_steps_ratio=0.25, total_training_steps=20)
    assert ratio.num_warmup_steps == 5


def test_parallel_layout() -> None:
    layouts = [ParallelLayout.create(4, r, tp_size=2) for r in range(4)]
    assert [lay.dp_rank for lay in layouts] == [0, 0, 1, 1]
    assert [lay.tp_rank for lay in layouts] == [0, 1, 0, 1]
    assert [lay.is_collect for lay in layouts] == [True, False, True, False]
    assert layouts[0].dp_size == 2
    with pytest.raises(
        ConfigError, match="world size 6 is not divisible by tensor_model_parallel_size 4"
    ):
        ParallelLayout.create(6, 0, tp_size=4)
    with pytest.raises(ConfigError, match="rank 4 is outside world size 4"):
        ParallelLayout.create(4, 4)
    with pytest.raises(ConfigError, match="pipeline_model_parallel_size must be a positive int"):
        ParallelLayout.create(4, 0, pp_size=0)


def test_parallel_layout_pipeline_and_sequence() -> None:
    """pp slowest, then dp, then sp, tp fastest; the collect rank is tp 0 / sp 0 of the
    last stage."""
    pp = [ParallelLayout.create(8, r, tp_size=2, pp_size=2) for r in range(8)]
    assert [lay.pp_rank for lay in pp] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [lay.dp_rank for lay in pp] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [lay.tp_rank for lay in pp] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert [lay.is_collect for lay in pp] == [False] * 4 + [True, False, True, False]
    assert pp[0].is_first_stage
    assert not pp[0].is_last_stage
    assert pp[5].is_last_stage
    sp = [ParallelLayout.create(4, r, sp_size=2) for r in range(4)]
    assert [lay.dp_rank for lay in sp] == [0, 0, 1, 1]
    assert [lay.sp_rank for lay in sp] == [0, 1, 0, 1]
    assert [lay.is_collect for lay in sp] == [True, False, True, False]
    assert (sp[0].dp_size, sp[0].tp_rank, sp[0].pp_rank) == (2, 0, 0)
    with pytest.raises(ConfigError, match=r"2 x pipeline_model_parallel_size 4 .* = 8"):
        ParallelLayout.create(12, 0, tp_size=2, pp_size=4)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("", 600.0), ("30", 30.0), ("abc", "number of seconds"), ("0", "greater than 0")],
)
def test_process_group_timeout_from_the_workers_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: float | str
) -> None:
    from sc_dispatch._setting import SettingValueError
    from sc_workers._settings import PG_TIMEOUT

    # The worker's own mapping is read, not the driver's os.environ.
    monkeypatch.setenv("SC_WORKERS_PG_TIMEOUT_S", "5")
    env = {"SC_WORKERS_PG_TIMEOUT_S": raw}
    if isinstance(expected, float):
        assert PG_TIMEOUT.get(env) == expected
    else:
        with pytest.raises(SettingValueError, match=f"SC_WORKERS_PG_TIMEOUT_S={raw!r}.*{expected}"):
            PG_TIMEOUT.get(env)
    assert PG_TIMEOUT.get({"SC_WORKERS_PG_TIMEOUT": "7"}) == PG_TIMEOUT.default  # 0.1's name
