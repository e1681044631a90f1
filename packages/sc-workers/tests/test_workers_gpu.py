"""The workers on a CUDA device (the ``gpu`` nox session; skipped without a GPU).

Each run is one rank in its own process (``launch(..., device="cuda")``): the nccl process
group, the actor/rollout/reference worker and the critic through the whole pipeline
(generate, log-probs, one actor update, values, one critic update), compared with the same
pipeline on the CPU:

* float32 on the GPU gives the CPU's numbers (within float tolerance) and the same greedy
  tokens;
* bfloat16 mixed precision (``param_dtype="auto"`` on a GPU with bf16) keeps float32 master
  weights and gives log-probs within bf16 rounding of float32;
* parameter and optimizer offload give exactly the numbers of the run without offload, and
  leave the parameters and the optimizer state on the CPU between stages.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from _workers_helpers import actor_config, critic_config, launch, make_tensors, run_pipeline

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available())"
    ),
    pytest.mark.timeout(300),
]

VARIANTS: dict[str, tuple[Any, dict[str, Any]]] = {
    # name: (device, FSDPConfig overrides)
    "cpu": ("cpu", {"param_dtype": "float32"}),
    "cuda_fp32": ("cuda", {"param_dtype": "float32"}),
    "cuda_bf16": ("cuda", {"param_dtype": "auto"}),
    "cuda_offload": (
        "cuda",
        {"param_dtype": "float32", "param_offload": True, "optimizer_offload": True},
    ),
}


def _cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    return value


def gpu_job(variant: str, rank: int, world: int, out: Path) -> None:
    """One rank: the pipeline of ``run_pipeline`` under ``VARIANTS[variant]``."""
    import torch.distributed as dist
    from sc_workers import ActorRolloutRefWorker, CriticWorker

    device, fsdp = VARIANTS[variant]
    a_cfg, c_cfg = actor_config(), critic_config()
    actor_fsdp = dataclasses.replace(a_cfg.actor.fsdp_config, **fsdp)
    a_cfg = dataclasses.replace(
        a_cfg,
        device=device,
        actor=dataclasses.replace(a_cfg.actor, fsdp_config=actor_fsdp),
        ref=dataclasses.replace(a_cfg.ref, fsdp_config=actor_fsdp),
    )
    c_cfg = dataclasses.replace(
        c_cfg, device=device, fsdp_config=dataclasses.replace(c_cfg.fsdp_config, **fsdp)
    )
    actor = ActorRolloutRefWorker(a_cfg, "actor_rollout_ref")
    critic = CriticWorker(c_cfg)
    actor.init_model()
    critic.init_model()
    result = _cpu(run_pipeline(actor, critic, make_tensors(), None))
    engine = actor.actor_engine
    assert engine is not None
    params = list(engine.module.parameters())
    optimizer = engine.optimizer
    assert optimizer is not None
    states = [v for s in optimizer.state.values() for k, v in s.items() if k != "step"]
    result["backend"] = str(dist.get_backend())
    result["param_devices"] = sorted({str(p.device) for p in params})
    result["param_dtypes"] = sorted({str(p.dtype) for p in params})
    result["optimizer_devices"] = sorted({str(t.device) for t in states})
    result["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0
    torch.save(result, out / f"{variant}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("gpu")
    results = {}
    for variant, (device, _) in VARIANTS.items():
        launch(functools.partial(gpu_job, variant), 1, out, timeout=240, device=device)
        results[variant] = torch.load(out / f"{variant}.pt", weights_only=False)
    return results


def _close(a: dict[str, Any], b: dict[str, Any], keys: list[str], atol: float) -> None:
    for key in keys:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=1e-3, msg=key)


NUMBERS = ["old_log_probs", "ref_log_prob", "new_log_probs", "values"]


def test_cuda_float32_matches_cpu(runs: dict[str, dict[str, Any]]) -> None:
    cpu, gpu = runs["cpu"], runs["cuda_fp32"]
    assert "nccl" in gpu["backend"]
    assert gpu["param_devices"] == ["cuda:0"]
    assert gpu["param_dtypes"] == ["torch.float32"]
    assert torch.equal(gpu["gen_responses"], cpu["gen_responses"])
    _close(gpu, cpu, NUMBERS, atol=1e-4)
    for name, tensor in cpu["actor_weights"].items():
        torch.testing.assert_close(gpu["actor_weights"][name], tensor, atol=1e-4, rtol=1e-3)


def test_bf16_mixed_precision_keeps_float32_masters(runs: dict[str, dict[str, Any]]) -> None:
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    bf16, fp32 = runs["cuda_bf16"], runs["cuda_fp32"]
    assert bf16["param_dtypes"] == ["torch.float32"]  # FSDP computes in bf16, keeps fp32
    _close(bf16, fp32, ["old_log_probs", "ref_log_prob"], atol=0.1)
    assert not torch.equal(bf16["old_log_probs"], fp32["old_log_probs"])  # it did run in bf16
    for key in ("actor_metrics", "critic_metrics"):
        for name, value in bf16[key].items():
            assert torch.isfinite(torch.tensor(value)).all(), (key, name, value)


def test_offload_changes_no_number_and_leaves_state_on_cpu(
    runs: dict[str, dict[str, Any]],
) -> None:
    off, on = runs["cuda_offload"], runs["cuda_fp32"]
    assert off["param_devices"] == ["cpu"]
    assert off["optimizer_devices"] == ["cpu"]
    assert on["optimizer_devices"] == ["cuda:0"]
    for key in [*NUMBERS, "gen_responses"]:
        assert torch.equal(off[key], on[key]), key  # moving tensors changes no value
    assert off["peak_cuda_mib"] > 0
