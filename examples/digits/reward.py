"""The digit task's reward, in verl's signature: the fraction of the answer's characters the
response has right, position by position (so a half-right answer earns 0.5)."""

from __future__ import annotations

from typing import Any


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    answer = "".join(solution_str.split())  # a tokenizer may decode with spaces between tokens
    right = sum(1 for a, b in zip(answer, ground_truth, strict=False) if a == b)
    return right / len(ground_truth)
