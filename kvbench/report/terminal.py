"""The compact per-task score tables: markdown (``render_markdown``, the top of ``report.md``) and rich
tables (what ``kvbench report`` prints).

Only rows of real, physically compacted forks (``real_fork`` true or absent) enter the tables; the
others are counted in the header. One table per (setting, task): a line per ``method [allocation]``, a column
per kept fraction ``p`` (descending), cells the task score (``tables.task_scores``: the mean, a mixed SCBench
task the mean of its sub-tasks). Every function takes row dicts or the DataFrame of ``data.frame``/``data.load``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.markup import escape
from rich.table import Table

from kvbench.report.data import SETTING, bench_label, frame, setting_title, usable
from kvbench.report.tables import FULL, across_groups, model_names, task_scores
from kvbench.results import ENDED_EARLY

__all__ = ["RANDOM_WARNING", "as_frame", "missing_lines", "render_markdown", "render_rich", "summarize", "write_report"]

RANDOM_WARNING = "**Model weights are random: these numbers say nothing about the methods.**"
Rows = pd.DataFrame | Iterable[dict]


def as_frame(rows: Rows) -> pd.DataFrame:
    """The report DataFrame of ``rows`` (row dicts are converted with ``data.frame``)."""
    return rows if isinstance(rows, pd.DataFrame) else frame(rows)


def summarize(rows: Rows) -> pd.DataFrame:
    """Task score ``score`` and row count ``n`` per (setting, task, label, p), with ``method`` and ``allocation``.

    Rows with ``real_fork`` false are excluded: only real compacted forks enter comparisons.
    """
    return task_scores(usable(as_frame(rows)))


@dataclass
class _Table:
    """A renderer-agnostic table: its (model, engine, bench) section, title, header, cells, footnote."""

    section: str
    title: str
    columns: list[str]
    cells: list[list[str]]
    note: str = ""


def _tables(rows: Rows, across: bool = True) -> list[_Table]:
    """The per-task tables and the mean-over-tasks table of every setting, then (``across``) the across-models
    tables of every group of settings that differ only in their model."""
    df = summarize(rows)
    tables = []
    for key, g in df.groupby(SETTING, sort=True):
        bench = key[SETTING.index("bench")]
        ps = sorted(g.p.unique(), reverse=True)
        labels = sorted(g.label.unique())
        tasks = sorted(g.task.unique())
        columns = ["method [allocation]", *(f"p={float(p)}" for p in ps)]
        section = setting_title(key, tasks)
        for task, t in g.groupby("task", sort=True):
            score = t.set_index(["label", "p"]).score
            cells = [[lab, *(f"{score[lab, p]:.1f}" if (lab, p) in score else "" for p in ps)] for lab in labels]
            tables.append(_Table(section, str(task), columns, cells))
        mean = g.groupby(["label", "p"]).score.agg(["mean", "count"])
        cells = [[lab, *(_mean_cell(mean, lab, p, len(tasks)) for p in ps)] for lab in labels]
        partial = any(c.endswith("*") for row in cells for c in row[1:])
        note = f"Cells marked * average fewer than the {len(tasks)} tasks of {bench} (some task lacks them)."
        tables.append(_Table(section, "mean over tasks", columns, cells, note if partial else ""))
    return tables + (_across_tables(df) if across else [])


def group_title(key: tuple, tasks: Sequence[str] = ()) -> str:
    """A title for one ``tables.GROUP`` tuple (a setting less its model)."""
    engine, bench, source, length, seed = key
    return f"{engine} · {bench_label(bench, source, tasks)} · length {length} · seed {seed}"


def common_tasks(across: pd.DataFrame, word: str = "common task") -> str:
    """``"N common task(s)"`` (``word`` pluralised) of one GROUP of ``tables.across_models``."""
    n = int(across.n_tasks.max())
    return f"{n} {word}" + ("" if n == 1 else "s")


def across_shown(across: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """One GROUP of ``tables.across_models`` as text: a row per label (``full`` first, then by mean rank,
    query-aware last), a column per (p, model), cells ``score (#rank)`` (``*``: the label lacks a common task
    there); and its footnote."""
    names = model_names(across)
    models = sorted(names, key=names.get)
    cols = [(m, p) for p in sorted(across.p.unique(), reverse=True) for m in models]
    cell = {(r.label, (r.model, r.model_fingerprint), r.p): r for r in across.itertuples(index=False)}
    aware = set(across.loc[across.query_aware.astype(bool), "label"])
    mean_rank = across.groupby("label")["rank"].mean()
    labels = sorted(set(across.label), key=lambda lab: (lab in aware, not lab.startswith(FULL + " "),
                                                        mean_rank.get(lab, math.inf), lab))  # fmt: skip

    def text(r) -> str:
        if r is None:
            return ""
        rank = "" if math.isnan(r.rank) else f" (#{r.rank:g})"
        return f"{r.score:.1f}{rank}" + ("" if r.complete else "*")

    shown = pd.DataFrame([[lab, *(text(cell.get((lab, m, p))) for m, p in cols)] for lab in labels],
                         columns=["method [allocation]", *(f"{names[m]} p={p}" for m, p in cols)])  # fmt: skip
    note = (
        f"Mean over the {common_tasks(across, 'task')} every model has, %; (#k): the method's "
        "rank among the query-agnostic methods at that model and p (1 = best; `full` and query-aware ceilings "
        "are not ranked)."
    )
    if not across.complete.all():
        note += " *: the method lacks some of those tasks there (not ranked)."
    return shown, note


def agreement_shown(agree: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """One GROUP of ``tables.rank_agreement`` as text: a row per p, a column per pair of models; its footnote."""
    pairs = sorted({(a, b) for a, b in agree[["model_a", "model_b"]].itertuples(index=False)})
    by = {(r.p, r.model_a, r.model_b): r for r in agree.itertuples(index=False)}

    def text(r) -> str:
        if r is None:
            return ""
        return f"n/a (n={r.n})" if math.isnan(r.tau) else f"{r.tau:+.2f} (n={r.n})"

    rows = [[f"p={p}", *(text(by.get((p, a, b))) for a, b in pairs)] for p in sorted(agree.p.unique(), reverse=True)]
    note = (
        "Kendall's tau-b between two models' scores of the methods both rank (1: the same order, 0: unrelated, "
        "-1: reversed); n: methods compared."
    )
    return pd.DataFrame(rows, columns=["p", *(f"{a} vs {b}" for a, b in pairs)]), note


def _across_tables(df: pd.DataFrame) -> list[_Table]:
    """The across-models tables of every GROUP holding two or more models."""
    out = []
    for key, g, a in across_groups(df):
        section = f"Across models — {group_title(key)}"
        shown, note = across_shown(g)
        title = f"mean over {common_tasks(g)}"
        out.append(_Table(section, title, list(shown.columns), shown.to_numpy().tolist(), note))
        if len(a):
            shown, note = agreement_shown(a)
            out.append(_Table(section, "rank agreement", list(shown.columns), shown.to_numpy().tolist(), note))
    return out


def _mean_cell(mean: pd.DataFrame, label: str, p: float, n_tasks: int) -> str:
    """Mean over the tasks that have this (label, p) cell; ``*`` when some task lacks it."""
    if (label, p) not in mean.index:
        return ""
    m = mean.loc[(label, p)]
    return f"{m['mean']:.1f}" + ("*" if m["count"] < n_tasks else "")


def counts_line(df: pd.DataFrame) -> str:
    """How many rows enter the tables and how many were excluded for not being real forks."""
    used = int(df.real_fork.sum())
    return f"{used} rows used ({len(df) - used} excluded: not a real compacted fork)."


def is_random(df: pd.DataFrame) -> bool:
    """Whether any row was produced with random model weights."""
    return bool(df.random_weights.any())


def missing_lines(rows: Rows, missing: dict[str, str] | None) -> list[str]:
    """One line per ``bench/task`` recorded as missing its data (or not fitting ``--length``) and without any
    row, and per task recorded as ending early (a later item did not fit: ``ends after N items: …``)."""
    df = as_frame(rows)
    have = set((df.bench.astype(str) + "/" + df.task.astype(str)).unique()) if len(df) else set()
    lines = []
    for name, reason in sorted((missing or {}).items()):
        if reason.startswith(ENDED_EARLY):
            lines.append(f"- **{name}** {reason}")
        elif name not in have:
            lines.append(f"- **{name}** missing: {reason}")
    return lines


def render_markdown(rows: Rows, missing: dict[str, str] | None = None, across: bool = True) -> str:
    """The full report as markdown: header, missing tasks, one table per task, a mean-over-tasks table per
    bench, and (``across``) the across-models tables. ``missing`` maps ``bench/task`` to the reason its data was
    unavailable."""
    df = as_frame(rows)
    lost = missing_lines(df, missing)
    lost = ["## Missing tasks", "", *lost, ""] if lost else []
    if not len(df):
        return "\n".join(["# kvbench results", "", "No results yet.", "", *lost])
    out = ["# kvbench results", "", counts_line(df), *([RANDOM_WARNING] if is_random(df) else []), "", *lost]
    tables = _tables(df, across)
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


def render_rich(rows: Rows) -> list[Table]:
    """The same tables as ``render_markdown``, as rich Tables.

    Every caption repeats the random-weights warning when it applies; the last one also gives the row counts.
    """
    df = as_frame(rows)
    if not len(df):
        return []
    tables = _tables(df)
    warning = RANDOM_WARNING.strip("*") if is_random(df) else ""
    out = []
    for t in tables:
        caption = [t.note, warning, counts_line(df) if t is tables[-1] else ""]
        table = Table(title=escape(f"{t.section} — {t.title}"), caption=escape("\n".join(filter(None, caption))))
        table.add_column(escape(t.columns[0]))
        for c in t.columns[1:]:
            table.add_column(c, justify="right")
        for row in t.cells:
            table.add_row(*map(escape, row))
        out.append(table)
    return out


def write_report(rows: Rows, out_path: Path, missing: dict[str, str] | None = None) -> Path:
    """Write the markdown report to ``out_path`` (parent directories created); return the path."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render_markdown(rows, missing), encoding="utf-8")
    return out_path
