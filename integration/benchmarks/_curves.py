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
    *,
    xlabel: str = "step",
    figsize: tuple[float, float] = (7, 4),
    small_legend: bool = False,
    reference: tuple[str, Sequence[tuple[int, float]]] | None = None,
) -> None:
    """One line per ``(label, [(step, value), ...])`` with a dotted line at ``threshold``,
    written to ``png`` (folders made). ``reference``, a curve drawn first in grey, small dots;
    ``small_legend``, the legend at the lower right in small print."""
    fig, ax = plt.subplots(figsize=figsize)
    if reference is not None:
        steps, values = zip(*reference[1], strict=True)
        ax.plot(steps, values, marker=".", color="grey", label=reference[0])
    for label, points in curves:
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, marker="o", label=label)
    ax.axhline(threshold, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(0, 1.05)
    if small_legend:
        ax.legend(loc="lower right", fontsize=8)
    else:
        ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def by_step(curve: dict[str, float]) -> list[tuple[int, float]]:
    """A curve stored as ``{"step": value}`` (a result file's JSON) as ``[(step, value)]``."""
    return [(int(step), value) for step, value in curve.items()]
