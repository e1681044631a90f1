"""The asynchronous trainer (``async_staleness`` k > 0, ``sc-demo --async-staleness K``): the
rollout samples the next batch while the actor trains on this one, and no batch that trains
the actor is more than k weight versions old."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from _trainer_runs import (
    assert_finite_training_metrics,
    assert_same_metrics,
    run,
    tiny_config,
    weight_sync,
)
from sc_core import SpanRecorder
from sc_protocol import DataProto
from sc_trainer import TaskRunner, TrainerConfig, TrainerConfigError, make_launcher
from sc_trainer.cli import build_parser, config_from_args
from sc_trainer.cli import demo_main as main
from sc_trainer.rollout import AsyncRollout, StalenessBoundError
from sc_trainer.runs import read_metrics

pytestmark = pytest.mark.timeout(300)


def _ages_of_a_run(config: TrainerConfig) -> tuple[list[int], list[dict[str, Any]]]:
    """Train, watching the calls themselves: every weight sync (its version, and how many
    updates the actor had made when it ran) and every update (the ``weight_version`` its
    batch carries). Returns each update's staleness in versions, and the metrics."""
    runner = TaskRunner(config)
    updates = 0
    actor_version_of: dict[int, int] = {}
    ages: list[int] = []
    with make_launcher(config).running():
        trainer = runner.build_trainer(make_launcher(config))
        trainer.init_workers()
        try:
            sync = weight_sync(trainer)
            assert sync is not None
            group = trainer.actor_rollout_wg
            real_sync = sync.sync
            real_update: Callable[[DataProto], DataProto] = group.update_actor

            def watched_sync() -> int:
                version = real_sync()
                actor_version_of[version] = updates
                return version

            def watched_update(batch: DataProto) -> DataProto:
                nonlocal updates
                ages.append(updates - actor_version_of[batch.meta_info["weight_version"]])
                out = real_update(batch)
                updates += 1
                return out

            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(sync, "sync", watched_sync)
                mp.setattr(group, "update_actor", watched_update)
                result = trainer.fit()
        finally:
            trainer.close()
    return ages, read_metrics(result.output.metrics_path)


@pytest.mark.parametrize(("k", "steps"), [(1, 4), (2, 6)])
def test_no_update_uses_a_batch_more_than_k_versions_old(
    k: int, steps: int, tmp_path: Path
) -> None:
    config = tiny_config(
        tmp_path,
        backend="local",
        placement="separate",
        async_staleness=k,
        steps=steps,
        val_every=steps,
        save_every=steps,
    )
    ages, history = _ages_of_a_run(config)
    assert len(ages) == steps
    assert max(ages) <= k, ages
    # the bound is reached: the rollout really ran ahead of the actor
    assert max(ages) == k, ages
    assert ages[0] == 0  # the first batch is sampled with the initial weights
    # the trainer's own record agrees with what the calls carried
    trained = [r for r in history if r["step"] > 0]
    assert [r["rollout/staleness"] for r in trained] == ages
    assert_finite_training_metrics(history, critic=True)
    assert all("timing/old_log_prob" not in r for r in trained)  # the rollout's log-probs


def test_k0_is_the_synchronous_loop_and_k1_is_not(tmp_path: Path) -> None:
    """k = 0 keeps the synchronous loop's numbers (a colocated run's, the sampling weights
    always the latest); k = 1 samples step 2 before update 1, so its numbers differ."""

    def without_sync_keys(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in r.items() if not k.startswith(("rollout/", "sync/"))} for r in history
        ]

    sync_run = read_metrics(
        run(tiny_config(tmp_path / "k0", backend="local", placement="separate")).output.metrics_path
    )
    colocated = read_metrics(
        run(tiny_config(tmp_path / "col", backend="local")).output.metrics_path
    )
    assert_same_metrics(without_sync_keys(sync_run), without_sync_keys(colocated))
    assert all("rollout/staleness" not in r for r in sync_run)
    k1 = read_metrics(
        run(
            tiny_config(tmp_path / "k1", backend="local", placement="separate", async_staleness=1)
        ).output.metrics_path
    )
    # the first step samples with the same weights and generator: the same batch
    assert k1[1]["train/reward"] == sync_run[1]["train/reward"]
    # step 2 trains version 1 on a batch of version 0 (the reference's weights): the sampling
    # policy's KL to the reference is 0, the synchronous run's is not
    assert abs(k1[2]["actor/kl_ref"]) < 1e-6 < abs(sync_run[2]["actor/kl_ref"])
    assert [r["rollout/staleness"] for r in k1[1:]] == [0, 1, 1, 1]


def test_grpo_runs_asynchronously(tmp_path: Path) -> None:
    """No critic: the step without values or a critic update still overlaps and trains."""
    config = tiny_config(
        tmp_path, backend="local", algorithm="grpo", placement="separate", async_staleness=1
    )
    history = read_metrics(run(config).output.metrics_path)
    assert [r["rollout/staleness"] for r in history[1:]] == [0, 1, 1, 1]
    assert_finite_training_metrics(history, critic=False)


def test_a_rollout_death_mid_generation_drops_the_prefetched_batch(tmp_path: Path) -> None:
    """The rollout rank dies in the generation launched at step 3 (for step 4); the death
    shows when step 4 waits for that batch (step 3 needs no sync: nothing is launched past
    the last step). The trainer drops it, recovers at step 2's checkpoint and regenerates
    step 3's batch with the restored weights (staleness 0), then goes on to the end."""
    config = tiny_config(
        tmp_path,
        backend="local",
        placement="separate",
        async_staleness=1,
        save_every=2,
        val_every=4,
        inject_fault="rollout:0@step=3:generate_sequences",
    )
    result = run(config)
    assert result.final_step == 4
    history = read_metrics(result.output.metrics_path)
    marked = [r for r in history if "recovery/count" in r]
    assert len(marked) == 1
    assert (marked[0]["recovery/failed_step"], marked[0]["recovery/from_step"]) == (4, 2)
    assert [r["step"] for r in history] == [0, 1, 2, 3, 4]
    assert [r["rollout/staleness"] for r in history[1:]] == [0, 1, 0, 1]
    assert_finite_training_metrics(history, critic=True)


def test_async_run_on_ray_overlaps_generation_and_update(ray_cluster: None, tmp_path: Path) -> None:
    """One actor and one rollout process, k=1 on Ray: the batches are at most one version
    old, and each step's generation (a non-blocking call, waited for on a thread: the
    ``generate_async`` span) overlaps a call on the actor's group of the step before. (dp=2
    on Ray is the placement tests' and the fault matrix's.)"""
    config = tiny_config(
        tmp_path, placement="separate", async_staleness=1, steps=3, val_every=3, save_every=3
    )
    with make_launcher(config).running(), SpanRecorder() as recorder:
        trainer = TaskRunner(config).build_trainer(make_launcher(config))
        trainer.init_workers()
        try:
            result = trainer.fit()
        finally:
            trainer.close()
    history = read_metrics(result.output.metrics_path)
    assert_finite_training_metrics(history, critic=True)
    assert [r["rollout/staleness"] for r in history[1:]] == [0, 1, 1]
    generations = [s for s in recorder.spans if s.method == "generate_async"]
    assert len(generations) == 3
    training = [
        (s.start, s.end or 0.0)
        for s in recorder.spans
        if s.method.endswith(
            ("compute_ref_log_prob", "compute_values", "update_critic", "update_actor")
        )
    ]
    # steps 2 and 3 were generated while a call of the step before ran on the actor's group
    for gen in generations[1:]:
        end = gen.end or 0.0
        assert any(min(end, t_end) > max(gen.start, t_start) for t_start, t_end in training), (
            gen.start,
            end,
        )


# ------------------------------------------------------------------- the pipeline alone
class _Done:
    def __init__(self, out: DataProto) -> None:
        self.out = out

    def get(self) -> DataProto:
        return self.out


class _FakeRollout:
    """Answers every generation with a batch sampled by weight version ``weight_version``."""

    def __init__(self) -> None:
        self.weight_version = 1
        self.launched: list[int] = []

    @property
    def generate_sequences(self) -> _FakeRollout:
        return self

    def options(self, **_: Any) -> _FakeRollout:
        return self

    def __call__(self, prompts: DataProto) -> _Done:
        self.launched.append(prompts.meta_info["step"])
        return _Done(DataProto(meta_info={"weight_version": self.weight_version}))


class _StepPrompts:
    """A prompt batch that says which step it is for."""

    def train_batch(self, step: int) -> DataProto:
        return DataProto(meta_info={"step": step})

    def val_batch(self) -> DataProto:
        return DataProto(meta_info={"do_sample": False})


def _pipeline(k: int) -> tuple[AsyncRollout, _FakeRollout]:
    fake = _FakeRollout()
    pipeline = AsyncRollout(cast(Any, fake), _StepPrompts(), k, last_step=10)
    return pipeline, fake


def test_a_generation_too_far_ahead_is_not_started() -> None:
    pipeline, fake = _pipeline(1)
    pipeline.synced(1, 0)
    assert pipeline.allowed(2)
    assert not pipeline.allowed(3)
    with pytest.raises(StalenessBoundError, match=r"step 3 trains actor version 2.*version 0"):
        pipeline.launch(3)
    assert fake.launched == []
    # after the update to version 1 the next launch (step 3) needs those weights
    pipeline.launch(2)
    assert pipeline.needs_sync(1, validate=False)
    pipeline.synced(2, 1)
    assert not pipeline.needs_sync(1, validate=False)
    assert pipeline.needs_sync(2, validate=True)  # a validation wants the newest weights
    pipeline.close()


def test_a_batch_older_than_the_bound_is_refused() -> None:
    pipeline, fake = _pipeline(1)
    pipeline.synced(1, 0)
    pipeline.synced(2, 3)  # the rollout serves version 3's weights, the batch says version 1
    with pytest.raises(StalenessBoundError, match=r"3 versions behind .* async_staleness=1"):
        pipeline.take_batch(4)
    fake.weight_version = 9
    with pytest.raises(StalenessBoundError, match=r"weight_version 9, which no weight sync"):
        pipeline.take_batch(4)
    pipeline.close()


# --------------------------------------------------------------------------- settings
def test_config_errors_name_the_value(tmp_path: Path) -> None:
    with pytest.raises(TrainerConfigError, match=r"async_staleness must be >= 0, got -1"):
        tiny_config(tmp_path, placement="separate", async_staleness=-1)
    with pytest.raises(TrainerConfigError, match=r"async_staleness must be an int, got True"):
        tiny_config(tmp_path, placement="separate", async_staleness=True)
    with pytest.raises(TrainerConfigError, match=r"async_staleness must be an int, got 1\.5"):
        tiny_config(tmp_path, placement="separate", async_staleness=1.5)
    with pytest.raises(
        TrainerConfigError, match=r"async_staleness=2 needs placement='separate' \(got 'colocated'"
    ):
        tiny_config(tmp_path, async_staleness=2)
    assert tiny_config(tmp_path, async_staleness=0).async_staleness == 0


def test_cli_async_staleness() -> None:
    """``--async-staleness K`` (K > 0) implies ``--placement separate`` unless told otherwise."""
    parse = build_parser().parse_args
    args = parse(["--placement", "separate", "--async-staleness", "2"])
    assert config_from_args(args).async_staleness == 2
    implied = config_from_args(parse(["--async-staleness", "1"]))
    assert (implied.async_staleness, implied.placement) == (1, "separate")
    default = config_from_args(parse([]))
    assert (default.async_staleness, default.placement) == (0, TrainerConfig.placement)


def test_cli_async_staleness_needs_a_separate_rollout(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--async-staleness", "1", "--placement", "colocated"])
    assert exc.value.code == 2
    assert "async_staleness=1 needs placement='separate'" in capsys.readouterr().err
