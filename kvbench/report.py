"""Per-task score tables from result rows, as markdown (``write_report``) or rich tables (the CLI).

Only rows of real, physically compacted forks (``real_fork`` true or absent) enter the tables; the
others are counted in the header. One table per (model, engine, bench, task): a line per
``method [allocation]``, a column per kept fraction ``p`` (descending), cells the mean score.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.markup import escape
from rich.table import Table

__all__ = ["render_markdown", "render_rich", "summarize", "write_report"]

GROUP = ["model", "engine", "bench", "task", "method", "allocation", "p"]
RANDOM_WARNING = "**Model weights are random: these numbers say nothing about the methods.**"


def summarize(rows: list[dict]) -> pd.DataFrame:
    """Mean ``score`` and row count ``n`` per (model, engine, bench, task, method, allocation, p).

    Rows with ``real_fork`` false are excluded: only real compacted forks enter comparisons.
    """
    df = pd.DataFrame([r for r in rows if r.get("real_fork", True)], columns=[*GROUP, "score"])
    df[GROUP[:-1]] = df[GROUP[:-1]].astype(str)
    df["p"] = df["p"].astype(float).round(4)
    df["score"] = df["score"].astype(float)
    out = df.groupby(GROUP, sort=True).score.agg(["mean", "count"]).reset_index()
    return out.rename(columns={"mean": "score", "count": "n"})


@dataclass
class _Table:
    """A renderer-agnostic table: its (model, engine, bench) section, title, header, cells, footnote."""

    section: str
    title: str
    columns: list[str]
    cells: list[list[str]]
    note: str = ""


def _tables(rows: list[dict]) -> list[_Table]:
    """The per-task tables and the mean-over-tasks table of every (model, engine, bench)."""
    df = summarize(rows)
    df["label"] = df.method + " [" + df.allocation + "]"
    tables = []
    for (model, engine, bench), g in df.groupby(["model", "engine", "bench"], sort=True):
        ps = sorted(g.p.unique(), reverse=True)
        labels = sorted(g.label.unique())
        tasks = sorted(g.task.unique())
        columns = ["method [allocation]", *(f"p={float(p)}" for p in ps)]
        section = f"{model} · {engine} · {bench}"
        for task, t in g.groupby("task", sort=True):
            score = t.set_index(["label", "p"]).score
            cells = [
                [lab, *(f"{score[lab, p]:.1f}" if (lab, p) in score else "" for p in ps)] for lab in labels
            ]
            tables.append(_Table(section, str(task), columns, cells))
        mean = g.groupby(["label", "p"]).score.agg(["mean", "count"])
        cells = [[lab, *(_mean_cell(mean, lab, p, len(tasks)) for p in ps)] for lab in labels]
        partial = any(c.endswith("*") for row in cells for c in row[1:])
        note = f"Cells marked * average fewer than the {len(tasks)} tasks of {bench} (some task lacks them)."
        tables.append(_Table(section, "mean over tasks", columns, cells, note if partial else ""))
    return tables


def _mean_cell(mean: pd.DataFrame, label: str, p: float, n_tasks: int) -> str:
    """Mean over the tasks that have this (label, p) cell; ``*`` when some task lacks it."""
    if (label, p) not in mean.index:
        return ""
    m = mean.loc[(label, p)]
    return f"{m['mean']:.1f}" + ("*" if m["count"] < n_tasks else "")


def _counts(rows: list[dict]) -> str:
    """How many rows enter the tables and how many were excluded for not being real forks."""
    used = sum(1 for r in rows if r.get("real_fork", True))
    return f"{used} rows used ({len(rows) - used} excluded: not a real compacted fork)."


def _is_random(rows: list[dict]) -> bool:
    """Whether any row was produced with random model weights."""
    return any(r.get("random_weights") for r in rows)


def missing_lines(rows: list[dict], missing: dict[str, str] | None) -> list[str]:
    """One line per ``bench/task`` recorded as missing its data and without any row."""
    have = {f"{r['bench']}/{r['task']}" for r in rows}
    return [f"- **{name}** missing: {reason}" for name, reason in sorted((missing or {}).items()) if name not in have]


def render_markdown(rows: list[dict], missing: dict[str, str] | None = None) -> str:
    """The full report as markdown: header, missing tasks, one table per task, a mean-over-tasks table per
    bench. ``missing`` maps ``bench/task`` to the reason its data was unavailable."""
    lost = missing_lines(rows, missing)
    lost = ["## Missing tasks", "", *lost, ""] if lost else []
    if not rows:
        return "\n".join(["# kvbench results", "", "No results yet.", "", *lost])
    out = ["# kvbench results", "", _counts(rows), *([RANDOM_WARNING] if _is_random(rows) else []), "", *lost]
    tables = _tables(rows)
    if not tables:
        out += ["No comparable results yet.", ""]
    for i, t in enumerate(tables):
        if i == 0 or tables[i - 1].section != t.section:
            out += [f"## {t.section}", ""]
        out += [f"### {t.title}", "", "| " + " | ".join(t.columns) + " |"]
        out += ["|---" + "|---:" * (len(t.columns) - 1) + "|"]
        out += ["| " + " | ".join(row) + " |" for row in t.cells]
        out += ["", t.note, ""] if t.note else [""]
    return "\n".join(out)


def render_rich(rows: list[dict]) -> list[Table]:
    """The same tables as ``render_markdown``, as rich Tables.

    Every caption repeats the random-weights warning when it applies; the last one also gives the row counts.
    """
    tables = _tables(rows)
    warning = RANDOM_WARNING.strip("*") if _is_random(rows) else ""
    out = []
    for t in tables:
        caption = [t.note, warning, _counts(rows) if t is tables[-1] else ""]
        table = Table(
            title=escape(f"{t.section} — {t.title}"), caption=escape("\n".join(filter(None, caption)))
        )
        table.add_column(escape(t.columns[0]))
        for c in t.columns[1:]:
            table.add_column(c, justify="right")
        for row in t.cells:
            table.add_row(*map(escape, row))
        out.append(table)
    return out


def write_report(rows: list[dict], out_path: Path, missing: dict[str, str] | None = None) -> Path:
    """Write the markdown report to ``out_path`` (parent directories created); return the path."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render_markdown(rows, missing), encoding="utf-8")
    return out_path
