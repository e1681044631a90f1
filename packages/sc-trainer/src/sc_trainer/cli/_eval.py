"""``sc-eval``: a checkpoint scored on a validation file, avg@k and pass@k.

sc-eval output/ --config config.yaml --k 8 --sample      # 8 samples a prompt
sc-eval output/checkpoints/global_step_300 --config config.yaml   # greedy, k = 1
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .._errors import ScTrainerError
from ..config import TRAIN_DEFAULTS, config_from_document, load_document, parse_overrides
from ..evaluation import evaluate
from ._errors import user_errors

__all__ = ["eval_main"]


def eval_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``sc-eval``; returns the exit status (2: a bad configuration)."""
    parser = argparse.ArgumentParser(
        prog="sc-eval",
        description=(
            "Score a model on a validation file with the run's reward function: avg@k (the "
            "mean score of k samples a prompt) and pass@k (the share of prompts with a sample "
            "scoring --pass-score or more). MODEL is a Hugging Face folder, a checkpoint "
            "folder or a run's output folder (its newest checkpoint); the config file (and "
            "KEY=VALUE overrides) give data.val_files, the data settings and the reward."
        ),
    )
    parser.add_argument("model", metavar="MODEL")
    parser.add_argument("--config", metavar="FILE", help="the run's config file")
    parser.add_argument("--k", type=int, default=1, help="samples a prompt (default: 1)")
    sampling = parser.add_mutually_exclusive_group()
    sampling.add_argument(
        "--greedy", dest="greedy", action="store_true", default=True, help="greedy (default)"
    )
    sampling.add_argument(
        "--sample", dest="greedy", action="store_false", help="sample at --temperature"
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--pass-score", type=float, default=1.0, help="a passing score")
    parser.add_argument("--out", metavar="DIR", help="write results.json and samples.jsonl")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    logging.basicConfig(level="WARNING", format="%(asctime)s %(name)s %(message)s")
    try:
        document = {} if args.config is None else load_document(args.config)
        document.update(parse_overrides(args.overrides))
        config = config_from_document(document, TRAIN_DEFAULTS).with_absolute_paths()
    except ScTrainerError as err:
        parser.error(str(err))
    try:
        result = evaluate(
            args.model,
            config,
            k=args.k,
            greedy=args.greedy,
            temperature=args.temperature,
            pass_score=args.pass_score,
            out_dir=args.out,
        )
    except Exception as err:
        if not isinstance(err, user_errors()):
            raise
        sys.stderr.write(f"sc-eval: error: {err}\n")
        return 1
    k = result.k
    lines = [
        f"sc-eval: {result.prompts} prompts, k={k} ({'greedy' if result.greedy else 'sampled'})",
        f"  avg@{k}  {result.avg_at_k:.4f}",
        f"  pass@{k} {result.pass_at_k:.4f}",
    ]
    for source, measures in result.by_source.items():
        lines.append(
            f"  {source}: avg@{k} {measures[f'avg@{k}']:.4f}, pass@{k} {measures[f'pass@{k}']:.4f}"
        )
    if result.failures:
        lines.append(f"  reward failures (counted): {result.failures}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
