"""Figures (matplotlib, no display needed): accuracy vs kept fraction, per task, averaged over tasks, and side by
side across models.

Each function takes the long frames of :mod:`kvbench.report.tables` for ONE setting (or one GROUP of settings
that differ only in their model) and returns a
``matplotlib.figure.Figure``; :func:`save` writes it as PNG and PDF. Lines: one per ranked ``method
[allocation]``; the no-prune score (``full``) as a grey horizontal line; query-aware labels (the ceiling) dashed;
a paired-bootstrap band per label where intervals are given.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # noqa: E402  (no display; must precede pyplot)
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from kvbench.report.tables import FULL, ranked_labels  # noqa: E402

__all__ = ["across_curves", "averaged_curves", "colors", "per_task_curves", "save"]

_PALETTE = plt.get_cmap("tab10").colors + plt.get_cmap("Dark2").colors


_X_TICKS = [0.2, 0.4, 0.6, 0.8, 1.0]
_Y_TICKS = [0, 20, 40, 60, 80, 100]


def colors(labels: list[str]) -> dict[str, tuple]:
    """A fixed colour per label (sorted order), the same in every figure of a report."""
    return {lab: _PALETTE[i % len(_PALETTE)] for i, lab in enumerate(sorted(labels))}


def _panel(ax, cells: pd.DataFrame, palette: dict, bands: pd.DataFrame | None) -> None:
    """One axes: the curves of ``cells`` (one task, or averaged), the no-prune line, the ceiling, the bands."""
    ranked = ranked_labels(cells)
    for lab, g in cells.groupby("label", sort=True):
        g = g.sort_values("p")
        if g.method.iloc[0] == FULL:
            for score in g.score:
                ax.axhline(score, color="0.45", lw=1.2, label="no prune (full)")
            continue
        aware = lab not in ranked
        ax.plot(g.p, g.score, ls="--" if aware else "-", marker="" if aware else "o", ms=3, lw=1.4,
                color=palette.get(lab, "k"), label=f"{lab} (query-aware ceiling)" if aware else lab)  # fmt: skip
        if bands is not None and not aware:
            b = bands[bands.label == lab].merge(g[["p", "score"]], on="p").sort_values("p")
            if len(b):
                ax.fill_between(b.p, b.score + b.lo - b["diff"], b.score + b.hi - b["diff"], color=palette.get(lab),
                                alpha=0.15, lw=0)  # fmt: skip
    ax.set_xlim(0.05, 1.02)
    ax.set_ylim(-3, 103)
    # fixed ticks: no tick search at every draw (a paper-sized report draws a hundred panels twice)
    ax.set_xticks(_X_TICKS)
    ax.set_yticks(_Y_TICKS)
    ax.grid(alpha=0.3)


def _legend(fig: Figure, axes) -> None:
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    if labels:
        fig.legend([handles[lab] for lab in labels], labels, loc="outside lower center", ncol=min(3, len(labels)),
                   fontsize=8, frameon=False)  # fmt: skip


def per_task_curves(cells: pd.DataFrame, title: str, palette: dict, bands: pd.DataFrame | None = None) -> Figure:
    """Accuracy (%) vs kept fraction p, one panel per task of ``cells`` (``tables.task_scores`` of one setting);
    ``bands``: ``tables.paired_bootstrap`` of that setting, drawn as each label's score shifted by its
    interval's ends minus its difference (the band excludes the reference's point iff the interval excludes 0)."""
    tasks = sorted(cells.task.unique())
    ncol = min(5, max(1, len(tasks)))
    nrow = math.ceil(len(tasks) / ncol)
    fig = Figure(figsize=(3.0 * ncol, 2.5 * nrow + 1.0), layout="constrained")
    axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
    for ax, task in zip(axes, tasks, strict=False):
        _panel(ax, cells[cells.task == task], palette, None if bands is None else bands[bands.task == task])
        ax.set_title(task, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes[len(tasks) :]:
        ax.set_visible(False)
    for ax in axes[::ncol]:
        ax.set_ylabel("accuracy (%)", fontsize=8)
    for ax in axes[(nrow - 1) * ncol :]:
        ax.set_xlabel("kept fraction p", fontsize=8)
    fig.suptitle(title, fontsize=10)
    _legend(fig, axes)
    return fig


def averaged_curves(avg: pd.DataFrame, title: str, palette: dict) -> Figure:
    """Mean accuracy over tasks vs kept fraction p for one setting (``tables.averaged``)."""
    fig = Figure(figsize=(6.0, 4.4), layout="constrained")
    ax = fig.subplots()
    _panel(ax, avg, palette, None)
    ax.set_xlabel("kept fraction p")
    ax.set_ylabel("mean accuracy over tasks (%)")
    ax.set_title(title.replace(" — ", "\n"), fontsize=9)  # what, then the setting: one line each
    _legend(fig, [ax])
    return fig


def across_curves(across: pd.DataFrame, names: dict[tuple[str, str], str], title: str, palette: dict) -> Figure:
    """One panel per model of one GROUP (``tables.across_models`` rows), side by side on the same axes: each
    label's mean over the tasks common to every model vs kept fraction p. Labels that lack a common task on a
    model (``complete`` False) are left out of that model's panel: their mean would be over other tasks.
    ``names``: ``tables.model_names`` (panel titles)."""
    models = sorted(across.groupby(["model", "model_fingerprint"], sort=True).groups)
    ncol = min(4, len(models))
    nrow = math.ceil(len(models) / ncol)
    fig = Figure(figsize=(4.2 * ncol, 3.4 * nrow + 1.0), layout="constrained")
    axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
    for ax, (model, fp) in zip(axes, models, strict=False):
        g = across[(across.model == model) & (across.model_fingerprint == fp) & across.complete.astype(bool)]
        _panel(ax, g, palette, None)
        ax.set_title(names.get((model, fp), model), fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes[len(models) :]:
        ax.set_visible(False)
    for ax in axes[::ncol]:
        ax.set_ylabel("mean accuracy (%)", fontsize=8)
    for ax in axes[(nrow - 1) * ncol :]:
        ax.set_xlabel("kept fraction p", fontsize=8)
    fig.suptitle(title, fontsize=10)
    _legend(fig, axes)
    return fig


def save(fig: Figure, stem: Path, dpi: int = 110) -> list[Path]:
    """Write ``stem.png`` and ``stem.pdf``; return both paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    # "tight": the canvas grows to hold a long title or a wide legend instead of cutting them off
    fig.savefig(paths[0], dpi=dpi, bbox_inches="tight", pad_inches=0.1)
    fig.savefig(paths[1], bbox_inches="tight", pad_inches=0.1)
    return paths
