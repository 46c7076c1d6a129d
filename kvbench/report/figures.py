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
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # noqa: E402  (no display; must precede pyplot)
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from kvbench.methods import REFERENCE  # noqa: E402
from kvbench.report.tables import ranked_labels  # noqa: E402

__all__ = ["SAVE_OPTIONS", "across_curves", "averaged_curves", "colors", "fit_title", "per_task_curves", "save"]

#: savefig options of every figure: the canvas grows to hold a long title or a wide legend instead of cutting
#: them off (constrained layout keeps a title inside the figure only vertically).
SAVE_OPTIONS = {"bbox_inches": "tight", "pad_inches": 0.1}
#: A title line's average character width, in ems of its font (DejaVu Sans runs about 0.55; kept on the safe side).
_EM_PER_CHAR = 0.6

_PALETTE = plt.get_cmap("tab10").colors + plt.get_cmap("Dark2").colors


_X_TICKS = [0.2, 0.4, 0.6, 0.8, 1.0]
_Y_TICKS = [0, 20, 40, 60, 80, 100]


def fit_title(text: str, width_in: float, fontsize: float) -> str:
    """``text`` broken into lines (at spaces, its own line breaks kept) that each fit ``width_in`` inches at
    ``fontsize`` points, so a figure's title stays inside the figure's width; a single word longer than a line
    stays whole (the tight save then widens the canvas for it)."""
    chars = max(16, int(width_in * 72 / (_EM_PER_CHAR * fontsize)))
    lines = []
    for line in text.split("\n"):
        lines += textwrap.wrap(line, chars, break_long_words=False, break_on_hyphens=False) or [""]
    return "\n".join(lines)


def colors(labels: list[str]) -> dict[str, tuple]:
    """A fixed colour per label (sorted order), the same in every figure of a report."""
    return {lab: _PALETTE[i % len(_PALETTE)] for i, lab in enumerate(sorted(labels))}


def _panel(ax, cells: pd.DataFrame, palette: dict, bands: pd.DataFrame | None) -> None:
    """One axes: the curves of ``cells`` (one task, or averaged), the no-prune line, the ceiling, the bands."""
    ranked = ranked_labels(cells)
    for lab, g in cells.groupby("label", sort=True):
        g = g.sort_values("p")
        if g.method.iloc[0] == REFERENCE:
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


def _panels(
    panels: list[tuple[str, pd.DataFrame, pd.DataFrame | None]],
    title: str,
    palette: dict,
    ylabel: str,
    max_cols: int,
    size: tuple[float, float],
) -> Figure:
    """A grid of :func:`_panel` axes, one per ``(panel title, cells, bands)``, at most ``max_cols`` a row, each
    ``size`` inches; axis labels on the outer panels, one legend for all."""
    ncol = min(max_cols, max(1, len(panels)))
    nrow = math.ceil(len(panels) / ncol)
    fig = Figure(figsize=(size[0] * ncol, size[1] * nrow + 1.0), layout="constrained")
    axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
    for ax, (name, cells, bands) in zip(axes, panels, strict=False):
        _panel(ax, cells, palette, bands)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[::ncol]:
        ax.set_ylabel(ylabel, fontsize=8)
    for ax in axes[(nrow - 1) * ncol :]:
        ax.set_xlabel("kept fraction p", fontsize=8)
    fig.suptitle(fit_title(title, size[0] * ncol - 0.2, 10), fontsize=10)
    _legend(fig, axes)
    return fig


def per_task_curves(cells: pd.DataFrame, title: str, palette: dict, bands: pd.DataFrame | None = None) -> Figure:
    """Accuracy (%) vs kept fraction p, one panel per task of ``cells`` (``tables.task_scores`` of one setting);
    ``bands``: ``tables.paired_bootstrap`` of that setting, drawn as each label's score shifted by its
    interval's ends minus its difference (the band excludes the reference's point iff the interval excludes 0)."""
    panels = [(task, cells[cells.task == task], None if bands is None else bands[bands.task == task])
              for task in sorted(cells.task.unique())]  # fmt: skip
    return _panels(panels, title, palette, "accuracy (%)", 5, (3.0, 2.5))


def averaged_curves(avg: pd.DataFrame, title: str, palette: dict) -> Figure:
    """Mean accuracy over tasks vs kept fraction p for one setting (``tables.averaged``)."""
    fig = Figure(figsize=(6.0, 4.4), layout="constrained")
    ax = fig.subplots()
    _panel(ax, avg, palette, None)
    ax.set_xlabel("kept fraction p")
    ax.set_ylabel("mean accuracy over tasks (%)")
    # what, then the setting, each on its own lines, within the axes' width (the figure's less the y labels)
    ax.set_title(fit_title(title.replace(" — ", "\n"), 5.0, 9), fontsize=9)
    _legend(fig, [ax])
    return fig


def across_curves(across: pd.DataFrame, names: dict[tuple[str, str], str], title: str, palette: dict) -> Figure:
    """One panel per model of one GROUP (``tables.across_models`` rows), side by side on the same axes: each
    label's mean over the tasks common to every model vs kept fraction p. Labels that lack a common task on a
    model (``complete`` False) are left out of that model's panel: their mean would be over other tasks.
    ``names``: ``tables.model_names`` (panel titles)."""
    models = sorted(across.groupby(["model", "model_fingerprint"], sort=True).groups)
    panels = [(names.get((m, fp), m), across[(across.model == m) & (across.model_fingerprint == fp)
                                             & across.complete.astype(bool)], None) for m, fp in models]  # fmt: skip
    return _panels(panels, title, palette, "mean accuracy (%)", 4, (4.2, 3.4))


def save(fig: Figure, stem: Path, dpi: int = 110) -> list[Path]:
    """Write ``stem.png`` and ``stem.pdf`` (each through :func:`kvbench.atomic.write_with`); return both paths."""
    from kvbench.atomic import write_with

    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    write_with(paths[0], lambda tmp: fig.savefig(tmp, format="png", dpi=dpi, **SAVE_OPTIONS))
    write_with(paths[1], lambda tmp: fig.savefig(tmp, format="pdf", **SAVE_OPTIONS))
    return paths
