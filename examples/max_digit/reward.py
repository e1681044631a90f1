"""An outcome-only reward, in verl's signature: 1.0 for exactly the right answer, else 0.0."""

from __future__ import annotations

from typing import Any


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    return 1.0 if solution_str.strip() == ground_truth else 0.0
