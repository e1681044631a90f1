"""A checkpoint scored on a validation file alone: avg@k and pass@k (``sc-eval``).

:func:`evaluate` loads the model (a Hugging Face folder, or a run's checkpoint exported to
one first), reads the prompts of the data files as a run does (``data.*``: the chat template,
the length limit), samples ``k`` responses per prompt with sc-workers' built-in engine in this
process (greedily, or at a temperature with a seed per sample, so a result can be reproduced),
scores each with the run's reward function, and reports

* ``avg@k``: the mean score over every sample;
* ``pass@k``: the share of prompts with at least one sample scoring ``pass_score`` or more;

overall and per ``data_source``, with every sample written to ``samples.jsonl``.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import tempfile
import zlib
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sc_rollout import GenerateRequest, SamplingParams
from sc_workers import load_hf_tokenizer
from sc_workers.rollout import TorchRolloutEngine, TorchRolloutEngineConfig

from .._errors import TrainerConfigError, int_at_least
from ..config import TrainerConfig
from ..rewards import RewardInput, RewardScorer, resolve_reward_function
from ..runs import export_checkpoint
from ..tasks._dataset import prompt_dataset

__all__ = ["EvaluationResult", "evaluate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluationResult:
    """What :func:`evaluate` measured (see the module's documentation)."""

    model: str
    files: tuple[str, ...]
    prompts: int
    k: int
    greedy: bool
    avg_at_k: float
    pass_at_k: float
    #: per data_source: {"prompts", "avg@k", "pass@k"}
    by_source: dict[str, dict[str, float]] = field(default_factory=dict)
    #: rows whose reward function failed (a run that opted into counting failures)
    failures: int = 0

    def to_json(self) -> str:
        data = asdict(self)
        data[f"avg@{self.k}"] = data.pop("avg_at_k")
        data[f"pass@{self.k}"] = data.pop("pass_at_k")
        return json.dumps(data, indent=1, sort_keys=True)


def _hf_folder(path: Path, scratch: Path) -> Path:
    """``path`` if it is a Hugging Face model folder, else its checkpoint's actor exported."""
    if (path / "config.json").is_file():
        return path
    return export_checkpoint(path, scratch / "model")


def evaluate(
    model: str | Path,
    config: TrainerConfig,
    *,
    k: int = 1,
    greedy: bool = True,
    temperature: float = 1.0,
    pass_score: float = 1.0,
    out_dir: str | Path | None = None,
) -> EvaluationResult:
    """Score ``model`` (a Hugging Face folder, a checkpoint folder or a run's output folder)
    on ``config.data.val_files`` with ``config.reward``'s function, ``k`` samples a prompt
    (see the module's documentation); ``out_dir`` gets ``results.json`` and
    ``samples.jsonl``."""
    data = config.data
    if not data.val_files:
        raise TrainerConfigError("evaluate: give the prompts to score in data.val_files")
    int_at_least(k, 1, "evaluate: k")
    if not greedy and not temperature > 0:
        raise TrainerConfigError(f"evaluate: sampling needs a temperature > 0, got {temperature}")
    with tempfile.TemporaryDirectory(prefix="sc-eval-") as scratch:
        folder = _hf_folder(Path(model), Path(scratch))
        tokenizer = load_hf_tokenizer(str(folder))
        dataset = prompt_dataset(data.val_files, data, tokenizer)
        prompts = [dataset[i] for i in range(len(dataset))]
        engine = TorchRolloutEngine(
            TorchRolloutEngineConfig(model=str(folder), seed=config.seed, max_batch_size=64)
        )
        try:
            responses = _generate(engine, prompts, tokenizer, k, greedy, temperature, config)
        finally:
            engine.close()
    reward = config.reward
    scorer = RewardScorer(
        resolve_reward_function(reward.path, reward.name),
        timeout_s=reward.timeout_s,
        max_workers=reward.max_workers,
        on_error=reward.on_error,
    )
    with scorer:
        inputs = [
            RewardInput(
                data_source=str(p["data_source"]),
                solution_str=text,
                ground_truth=p["ground_truth"],
                extra_info=p["extra_info"] if isinstance(p["extra_info"], dict) else None,
                row=int(p["row_index"]),
            )
            for p, texts in zip(prompts, responses, strict=True)
            for text in texts
        ]
        outcome = scorer.score(inputs)
    result = _summarise(str(model), data.val_files, prompts, outcome.scores, k, greedy, pass_score)
    result = EvaluationResult(**{**asdict(result), "failures": outcome.failures})
    if out_dir is not None:
        _write(Path(out_dir), result, prompts, responses, outcome.scores, k)
    return result


def _generate(
    engine: TorchRolloutEngine,
    prompts: list[dict[str, Any]],
    tokenizer: Any,
    k: int,
    greedy: bool,
    temperature: float,
    config: TrainerConfig,
) -> list[list[str]]:
    """``k`` decoded responses per prompt, the requests sent all at once (the engine batches
    them); each sample seeded from the run's seed and its prompt and sample numbers."""
    eos = tokenizer.eos_token_id
    stop = (int(eos),) if isinstance(eos, int) else ()

    def request(row: int, sample: int) -> GenerateRequest:
        seed = zlib.crc32(f"{config.seed}:{row}:{sample}".encode()) & 0x7FFFFFFF
        params = SamplingParams(
            max_tokens=config.data.max_response_length,
            temperature=0.0 if greedy else temperature,
            seed=seed,
            stop_token_ids=stop,
        )
        return GenerateRequest(prompts[row]["input_ids"], params, request_id=f"{row}-{sample}")

    texts: list[list[str]] = [[""] * k for _ in prompts]
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        futures = {
            pool.submit(engine.generate, request(row, sample)): (row, sample)
            for row in range(len(prompts))
            for sample in range(k)
        }
        for future in concurrent.futures.as_completed(futures):
            row, sample = futures[future]
            ids = list(future.result().token_ids)
            texts[row][sample] = tokenizer.decode(ids, skip_special_tokens=True)
    return texts


def _summarise(
    model: str,
    files: tuple[str, ...],
    prompts: list[dict[str, Any]],
    scores: list[float],
    k: int,
    greedy: bool,
    pass_score: float,
) -> EvaluationResult:
    per_prompt = [scores[i * k : (i + 1) * k] for i in range(len(prompts))]
    groups: dict[str, list[list[float]]] = defaultdict(list)
    for prompt, samples in zip(prompts, per_prompt, strict=True):
        groups[str(prompt["data_source"])].append(samples)

    def measures(rows: list[list[float]]) -> tuple[float, float]:
        flat = [s for row in rows for s in row]
        avg = math.fsum(flat) / len(flat) if flat else 0.0
        passed = sum(1 for row in rows if max(row) >= pass_score)
        return avg, passed / len(rows) if rows else 0.0

    avg, passed = measures(per_prompt)
    by_source = {}
    for source, rows in sorted(groups.items()):
        source_avg, source_pass = measures(rows)
        by_source[source] = {
            "prompts": float(len(rows)),
            f"avg@{k}": source_avg,
            f"pass@{k}": source_pass,
        }
    return EvaluationResult(model, files, len(prompts), k, greedy, avg, passed, by_source)


def _write(
    out: Path,
    result: EvaluationResult,
    prompts: list[dict[str, Any]],
    responses: list[list[str]],
    scores: list[float],
    k: int,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(result.to_json() + "\n", encoding="utf-8")
    with (out / "samples.jsonl").open("w", encoding="utf-8") as fh:
        for row, (prompt, texts) in enumerate(zip(prompts, responses, strict=True)):
            for sample, text in enumerate(texts):
                record = {
                    "row_index": prompt["row_index"],
                    "data_source": prompt["data_source"],
                    "prompt": prompt["prompt_text"],
                    "response": text,
                    "ground_truth": prompt["ground_truth"],
                    "score": scores[row * k + sample],
                }
                fh.write(json.dumps(record, default=str) + "\n")
    logger.info("evaluation written to %s", out)
