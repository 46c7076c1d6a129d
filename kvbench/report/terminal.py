"""The compact per-task score tables: markdown (``render_markdown``, the top of ``report.md``) and rich
tables (what ``kvbench report`` prints).

Only rows of real, physically compacted forks (``real_fork`` true or absent) enter the tables; the
others are counted in the header. Cells are task scores (``tables.task_scores``: the mean, a mixed SCBench task
the mean of its sub-tasks), 0-100. Per setting (one heading: model, engine, bench, length, seed):

* one method at one kept fraction (e.g. ``kvbench run --method gatesight --p 0.1``): one compact table, a row per
  task and the mean, columns no prune (method ``full``), the method and its difference from no prune (points);
* otherwise a table per task and one of the mean over tasks: the no-prune row first, then a row per
  ``method [allocation]`` followed by its difference from no prune, a column per kept fraction ``p``
  (descending);
* only no-prune rows: one line saying so, with its scores.

Every function takes row dicts or the DataFrame of ``data.frame``/``data.load``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kvbench.atomic import write_atomic
from kvbench.methods import METHODS, REFERENCE
from kvbench.report.data import SETTING, bench_label, frame, setting_title, usable
from kvbench.report.tables import across_groups, model_names, ranked_labels, task_scores
from kvbench.results.keys import ENDED_EARLY

__all__ = ["RANDOM_WARNING", "Heading", "as_frame", "choice_notes", "missing_lines", "print_report", "reference_note",
           "render_markdown", "render_rich", "summarize", "write_report"]  # fmt: skip

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


#: How the tables name the no-prune reference (method ``full`` at p = 1.0): its row, and its column in the compact
#: table; each method's difference from it is the row (or column) :data:`VS_NO_PRUNE`, points.
NO_PRUNE, NO_PRUNE_COLUMN, VS_NO_PRUNE = f"no prune ({REFERENCE})", "no prune", "vs no prune"


@dataclass
class _Table:
    """A renderer-agnostic table: its section (markdown's long title of the setting) and ``heading`` (the parts of
    the terminal's short heading of the same group), its short title (the task), header, cells, footnote. A table
    without columns is one line of text (``note``), e.g. a group that has only no-prune rows."""

    section: str
    title: str
    columns: list[str]
    cells: list[list[str]]
    note: str = ""
    heading: tuple[str, ...] = ()


def setting_heading(key: tuple) -> tuple[str, ...]:
    """The terminal's heading of one SETTING tuple, in parts (joined by `` · ``, broken between parts where the
    console is narrower): model (fingerprint), engine, bench (no task list: the tables name the tasks), length,
    seed."""
    model, fingerprint, engine, bench, source, length, seed = key
    weights = f" ({fingerprint[:12]})" if fingerprint else ""
    return (f"{model}{weights}", engine, bench_label(bench, source), f"length {length}", f"seed {seed}")


def _fmt(x: float) -> str:
    return "" if x is None or math.isnan(x) else f"{x:.1f}"


def _drop(x: float) -> str:
    return "" if x is None or math.isnan(x) else f"{x:+.1f}"


def split_reference(g: pd.DataFrame) -> tuple[pd.Series, pd.DataFrame]:
    """The no-prune score per task (method ``full`` at p = 1.0; the first such label by name where there are
    several) of ``g`` (:func:`summarize` rows of one setting), and the other rows."""
    is_full = (g.method.astype(str) == REFERENCE) & (g.p == 1.0)
    if not is_full.any():
        return pd.Series(dtype=float), g
    label = sorted(g.loc[is_full, "label"].unique())[0]
    ref = is_full & (g.label == label)
    return g[ref].set_index("task").score, g[~ref]


def _mean(values: Sequence[float], n_tasks: int) -> str:
    """The mean of ``values`` (one per task that has the cell), ``*`` when fewer than ``n_tasks`` have it."""
    if not values:
        return ""
    return f"{sum(values) / len(values):.1f}" + ("*" if len(values) < n_tasks else "")


def _mean_drop(pairs: Sequence[tuple[float, float]], n_tasks: int) -> str:
    """The mean over tasks of (method − no prune) for the tasks that have both, ``*`` when fewer than ``n_tasks``."""
    if not pairs:
        return ""
    return f"{sum(m - r for m, r in pairs) / len(pairs):+.1f}" + ("*" if len(pairs) < n_tasks else "")


def _setting_tables(key: tuple, g: pd.DataFrame) -> list[_Table]:
    """The tables of one setting: compact (one method at one p: a row per task and the mean, columns no prune,
    the method, its difference), else a table per task and the mean over tasks (the no-prune row first, then each
    method with its difference row); a setting with only no-prune rows gets one line saying so."""
    tasks = sorted(g.task.unique())
    section, heading = setting_title(key, tasks), setting_heading(key)
    ref, rest = split_reference(g)
    if rest.empty:
        scores = ", ".join(f"{t} {ref[t]:.1f}" for t in tasks)
        line = f"Only no-prune rows ({REFERENCE}) here, nothing to compare: {scores}. Add a method: --method NAME."
        return [_Table(section, "", [], [], line, heading)]
    bench = key[SETTING.index("bench")]
    partial = f"*: a mean over fewer than the {len(tasks)} tasks of {bench} (some task lacks the cell)."
    ps = sorted(rest.p.unique(), reverse=True)
    labels = sorted(rest.label.unique())
    score = rest.set_index(["label", "p", "task"]).score
    has = {(lab, p, t) for lab, p, t in score.index}
    if len(labels) == 1 and len(ps) == 1:
        (lab,), (p,) = labels, ps
        cells = [[str(t), _fmt(ref.get(t, math.nan)), _fmt(score.get((lab, p, t), math.nan)),
                  _drop(score.get((lab, p, t), math.nan) - ref.get(t, math.nan))] for t in tasks]  # fmt: skip
        mine = [score[lab, p, t] for t in tasks if (lab, p, t) in has]
        both = [(score[lab, p, t], ref[t]) for t in tasks if (lab, p, t) in has and t in ref.index]
        cells.append(["mean", _mean([ref[t] for t in tasks if t in ref.index], len(tasks)), _mean(mine, len(tasks)),
                      _mean_drop(both, len(tasks))])  # fmt: skip
        columns = ["task", NO_PRUNE_COLUMN, f"{lab} p={float(p)}", VS_NO_PRUNE]
        if ref.empty:
            columns, cells = [columns[0], columns[2]], [[row[0], row[2]] for row in cells]
        note = partial if any(c.endswith("*") for c in cells[-1]) else ""
        return [_Table(section, "per task", columns, cells, note, heading)]
    columns = ["method [allocation]", *(f"p={float(p)}" for p in ps)]
    tables = []
    for t in tasks:
        rows = [[NO_PRUNE, *[_fmt(ref[t])] * len(ps)]] if t in ref.index else []
        for lab in labels:
            rows.append([lab, *(_fmt(score.get((lab, p, t), math.nan)) for p in ps)])
            if t in ref.index:
                rows.append([f"  {VS_NO_PRUNE}", *(_drop(score.get((lab, p, t), math.nan) - ref[t]) for p in ps)])
        tables.append(_Table(section, str(t), columns, rows, heading=heading))
    have_ref = [t for t in tasks if t in ref.index]
    rows = [[NO_PRUNE, *[_mean([ref[t] for t in have_ref], len(tasks))] * len(ps)]] if have_ref else []
    for lab in labels:
        rows.append([lab, *(_mean([score[lab, p, t] for t in tasks if (lab, p, t) in has], len(tasks)) for p in ps)])
        if have_ref:
            both = [[(score[lab, p, t], ref[t]) for t in have_ref if (lab, p, t) in has] for p in ps]
            rows.append([f"  {VS_NO_PRUNE}", *(_mean_drop(pairs, len(tasks)) for pairs in both)])
    note = partial if any(c.endswith("*") for row in rows for c in row[1:]) else ""
    tables.append(_Table(section, "mean over tasks", columns, rows, note, heading))
    return tables


def _tables(rows: Rows, across: bool = True) -> list[_Table]:
    """The tables of every setting (:func:`_setting_tables`), then (``across``) the across-models tables of every
    group of settings that differ only in their model."""
    df = summarize(rows)
    tables = []
    for key, g in df.groupby(SETTING, sort=True):
        tables += _setting_tables(key, g)
    return tables + (_across_tables(df) if across else [])


def reference_note(rows: Rows) -> str:
    """A line naming the settings of ``rows`` that have no no-prune rows and how to add them; ``""`` when every
    setting has them."""
    df = summarize(rows)
    if df.empty:
        return ""
    lacking = [key for key, g in df.groupby(SETTING, sort=True) if split_reference(g)[0].empty]
    if not lacking:
        return ""
    model, _, _, bench, _, length, seed = lacking[0]
    more = f" and {len(lacking) - 1} more" if len(lacking) > 1 else ""
    where = f"{model}, {bench}, length {length}, seed {seed}{more}"
    return f"no no-prune rows for {where}: rerun without --no-reference (rows there are kept)"


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
    labels = sorted(set(across.label), key=lambda lab: (lab in aware, not lab.startswith(REFERENCE + " "),
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
        engine, bench, source, length, seed = key
        heading = ("Across models", engine, bench_label(bench, source), f"length {length}", f"seed {seed}")
        shown, note = across_shown(g)
        title = f"mean over {common_tasks(g)}"
        out.append(_Table(section, title, list(shown.columns), shown.to_numpy().tolist(), note, heading))
        if len(a):
            shown, note = agreement_shown(a)
            cells = shown.to_numpy().tolist()
            out.append(_Table(section, "rank agreement", list(shown.columns), cells, note, heading))
    return out


def counts_line(df: pd.DataFrame) -> str:
    """How many rows enter the tables and how many were excluded for not being real forks."""
    used = int(df.real_fork.sum())
    return f"{used} rows used ({len(df) - used} excluded: not a real compacted fork)."


def is_random(df: pd.DataFrame) -> bool:
    """Whether any row was produced with random model weights."""
    return bool(df.random_weights.any())


#: How ``str()`` of a :class:`~kvbench.errors.MissingDataError` joins its reason and its fix (``missing.json``
#: records that text), so the report can group tasks by reason and give each fix once, as the run does.
FIX_SEPARATOR = ". Fix: "


def missing_lines(rows: Rows, missing: dict[str, str] | None) -> list[str]:
    """The tasks recorded as missing their data (or not fitting ``--length``) and without any row, one line per
    distinct reason naming every task that has it (e.g. the SCBench tasks that need its hub data), then each
    distinct fix once (``- to run them: …``), as the run says them; and a line per task recorded as ending early
    (a later item did not fit: ``ends after N items: …``)."""
    df = as_frame(rows)
    have = set((df.bench.astype(str) + "/" + df.task.astype(str)).unique()) if len(df) else set()
    ended, reasons, fixes = [], {}, {}
    for name, text in sorted((missing or {}).items()):
        if text.startswith(ENDED_EARLY):
            ended.append(f"- **{name}** {text}")
        elif name not in have:
            bench, _, task = name.partition("/")
            reason, _, fix = text.partition(FIX_SEPARATOR)
            reasons.setdefault((bench, reason), []).append(task)
            if fix:
                fixes.setdefault(fix, []).append(name)
    lines = []
    for (bench, reason), tasks in reasons.items():
        names = f"{bench}/{tasks[0]}" if len(tasks) == 1 else f"{bench}/{', '.join(tasks)} ({len(tasks)} tasks)"
        lines.append(f"- **{names}** missing: {reason}")
    lines += [f"- to run {'it' if len(names) == 1 else 'them'}: {fix}" for fix, names in fixes.items()]
    return lines + ended


def render_markdown(rows: Rows, missing: dict[str, str] | None = None, across: bool = True) -> str:
    """The full report as markdown: header, missing tasks, the tables of every setting (:func:`_setting_tables`:
    the no-prune reference first, each method's difference from it) and (``across``) the across-models tables.
    ``missing`` maps ``bench/task`` to the reason its data was unavailable."""
    df = as_frame(rows)
    lost = missing_lines(df, missing)
    lost = ["## Missing tasks", "", *lost, ""] if lost else []
    if not len(df):
        return "\n".join(["# kvbench results", "", "No results yet.", "", *lost])
    no_ref = reference_note(df)
    out = ["# kvbench results", "", counts_line(df), *([RANDOM_WARNING] if is_random(df) else []),
           *([no_ref[0].upper() + no_ref[1:] + "."] if no_ref else []), "", *lost]  # fmt: skip
    tables = _tables(df, across)
    if not tables:
        out += ["No comparable results yet.", ""]
    for i, t in enumerate(tables):
        if i == 0 or tables[i - 1].section != t.section:
            out += [f"## {t.section}", ""]
        if not t.columns:
            out += [t.note, ""]
            continue
        out += [f"### {t.title}", "", "| " + " | ".join(t.columns) + " |"]
        out += ["|---" + "|---:" * (len(t.columns) - 1) + "|"]
        out += ["| " + " | ".join(row) + " |" for row in t.cells]
        out += ["", t.note, ""] if t.note else [""]
    return "\n".join(out)


class Heading:
    """A group's heading: its ``parts`` joined by `` · `` on one line, broken between two parts (never inside one)
    where the console is narrower than the whole."""

    def __init__(self, parts: Sequence[str]) -> None:
        self.parts = tuple(parts)

    def lines(self, width: int) -> list[str]:
        """The heading's lines for a console ``width`` columns wide."""
        lines = [""]
        for part in self.parts:
            joined = f"{lines[-1]} · {part}" if lines[-1] else part
            if lines[-1] and cell_len(joined) > width:
                lines.append(part)
            else:
                lines[-1] = joined
        return lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text("")
        for line in self.lines(options.max_width):
            yield Text(line, style="bold", no_wrap=True, overflow="ellipsis")


def _rich_table(t: _Table) -> Table:
    """``t`` as a rich Table: its short title (the table is at least as wide, so the title keeps to one line), the
    first column left-aligned, the rest right-aligned."""
    table = Table(title=escape(t.title), min_width=cell_len(t.title) + 4)
    table.add_column(escape(t.columns[0]))
    for c in t.columns[1:]:
        table.add_column(escape(c), justify="right")
    for row in t.cells:
        table.add_row(*map(escape, row))
    return table


def render_rich(rows: Rows) -> list[RenderableType]:
    """The tables of ``render_markdown`` for the terminal, in order: the random-weights warning (when it applies),
    then per group its :class:`Heading` and its tables (short titles: the task), each footnote as a line of its
    own (a group with only no-prune rows: that one line), and last the row counts."""
    df = as_frame(rows)
    if not len(df):
        return []
    out: list[RenderableType] = []
    if is_random(df):
        out.append(Text(RANDOM_WARNING.strip("*"), style="bold yellow"))
    tables = _tables(df)
    for i, t in enumerate(tables):
        if i == 0 or tables[i - 1].heading != t.heading:
            out.append(Heading(t.heading))
        if t.columns:
            out.append(_rich_table(t))
        if t.note:
            out.append(Text(t.note, style="" if not t.columns else "dim"))
    out.append(Text(counts_line(df)))
    return out


def print_report(console: Console, renderables: Sequence[RenderableType]) -> None:
    """Print ``render_rich``'s output on ``console``: text wraps at the console's width, headings break between
    their parts; a table wider than the console (many kept fractions, long labels) is printed at its own width
    rather than squeezed, which would cut its labels."""
    for item in renderables:
        if isinstance(item, Table):
            width = Measurement.get(console, console.options, item).maximum
            if width > console.width:
                Console(width=width, file=console.file, color_system=console.color_system).print(item)
                continue
        console.print(item)


def choice_notes(
    avg: pd.DataFrame,
    reference: str | None,
    compare: str | None,
    given_reference: str | None = None,
    given_compare: str | None = None,
    *,
    defaults: tuple[str | None, str | None] = (None, None),
) -> list[str]:
    """What the terminal says about the report's confidence intervals and "Every method against" tables, only
    where the user can act, each line naming the flag that acts: a ``--reference`` / ``--compare`` method given
    without rows; a stand-in for a default method chosen among several methods; a run whose settings have one
    method each (besides ``full`` and query-aware ceilings), which compares nothing. ``avg``:
    :func:`kvbench.report.tables.averaged` of the usable rows; ``reference``, ``compare``: the methods the report
    chose (``kvbench.report.render.choose_methods``); ``given_*``: the options as the user gave them;
    ``defaults``: the reference and comparison methods ``kvbench report`` defaults to."""
    if avg.empty:
        return []
    ranked = avg[avg.label.isin(ranked_labels(avg))]
    methods = sorted(set(ranked.method.astype(str)))
    several = bool(len(ranked)) and bool((ranked.groupby(SETTING, observed=True).method.nunique() >= 2).any())
    present = set(avg.method.astype(str))
    notes = []
    views = [("confidence intervals", "--reference", given_reference, reference, defaults[0]),
             ('the "Every method against" tables', "--compare", given_compare, compare, defaults[1])]  # fmt: skip
    for what, flag, given, chosen, default in views:
        if given is not None and given not in present:
            notes.append(f"{flag} {given}: no {given} rows, so no {what}; name one of {', '.join(methods) or '(none)'}")
        elif given is None and several and chosen not in (None, default):
            notes.append(f"{what} compare with {chosen} (no {default} rows); {flag} METHOD picks another")
    if methods and not several:
        other = next((name for name in METHODS if name not in present and name != REFERENCE), "NAME")
        notes.append(f"for confidence intervals add a method: --method {methods[0]},{other} (rows there are kept)")
    return notes


def write_report(rows: Rows, out_path: Path, missing: dict[str, str] | None = None) -> Path:
    """Write the markdown report to ``out_path`` (parent directories created); return the path."""
    out_path = Path(out_path)
    write_atomic(out_path, render_markdown(rows, missing))
    return out_path
