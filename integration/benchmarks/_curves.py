"""Validation curves as a png, for the benchmark scripts that record them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt


def plot_curves(
    curves: Sequence[tuple[str, Sequence[tuple[int, float]]]],
    title: str,
    ylabel: str,
    png: Path,
    threshold: float = 0.9,
) -> None:
    """One line per ``(label, [(step, value), ...])`` with a dotted line at ``threshold``,
    written to ``png`` (folders made)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in curves:
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, marker="o", label=label)
    ax.axhline(threshold, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(0, 1.05)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
