"""Renderers: the views of :mod:`kvbench.report.tables` and :mod:`kvbench.report.figures` as one report
directory: ``index.html`` (self-contained: figures embedded as PNG data URIs, no script, no network),
``report.md``, ``tables/<name>.csv`` and ``tables/<name>.tex`` (booktabs) for every table, and
``figures/<name>.png`` / ``.pdf`` for every figure.

:func:`build` computes everything from the rows (pure apart from matplotlib), :func:`write` writes it.
"""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from kvbench.atomic import write_atomic
from kvbench.report import figures as F
from kvbench.report import tables as T
from kvbench.report.data import SETTING, setting_title, usable
from kvbench.report.terminal import (
    RANDOM_WARNING,
    across_shown,
    agreement_shown,
    common_tasks,
    counts_line,
    group_title,
    is_random,
    missing_lines,
    render_markdown,
)

__all__ = ["Figure", "Options", "Report", "Section", "Table", "build", "choose_methods", "write"]


@dataclass
class Options:
    """Report settings: the CI reference method and the method every other is compared with (None: the defaults,
    :func:`choose_methods`), bootstrap resamples and seed, the serving view's accelerator memory (bytes) and
    context length (tokens), the ``kvbench cost`` output (parsed JSON) if any."""

    reference: str | None = None
    compare: str | None = None
    #: the methods used when the rows have them and no ``reference`` / ``compare`` is given (``kvbench report``
    #: passes its defaults); None: the stand-ins of :func:`choose_methods`
    default_reference: str | None = None
    default_compare: str | None = None
    n_resamples: int = 10_000
    seed: int = 0
    gpu_bytes: int = 141 * 10**9
    gpu_label: str = "141GB"
    serve_length: int = 131_072
    cost: dict | None = None
    figures: bool = True


@dataclass
class Table:
    """One table: ``data`` (numeric, written as CSV), ``shown`` (strings, what HTML / markdown / LaTeX show),
    ``bold`` (cells of ``shown`` to emphasise: (row index, column))."""

    name: str
    title: str
    data: pd.DataFrame
    shown: pd.DataFrame
    note: str = ""
    bold: set[tuple[int, str]] = field(default_factory=set)
    kind: str = ""


@dataclass
class Figure:
    name: str
    title: str
    png: bytes  # what index.html embeds and figures/NAME.png holds
    pdf: bytes  # figures/NAME.pdf
    caption: str = ""


@dataclass
class Section:
    title: str
    blocks: list[Table | Figure] = field(default_factory=list)


@dataclass
class Report:
    """``notes``: what the report chose (a CI reference or comparison method other than the default) and which
    views it left out where, one line each; they are also the last lines of ``header``."""

    header: list[str]
    sections: list[Section]
    markdown_head: str
    notes: list[str] = field(default_factory=list)


def _fmt(x: float, digits: int = 1, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _slug(key: tuple) -> str:
    model, fp, engine, bench, source, length, seed = key
    return _file_name([model, fp[:8], engine, *_bench_parts(bench, source), f"L{length}", f"s{seed}"])


def _group_slug(key: tuple) -> str:
    """A file name for one ``tables.GROUP`` tuple."""
    engine, bench, source, length, seed = key
    return _file_name([engine, *_bench_parts(bench, source), length, seed])


def _bench_parts(bench: str, source: str) -> list[str]:
    """A file name's bench part: the bench, and its source where the rows name one."""
    return [bench] if source == "None" else [bench, source]


def _file_name(parts) -> str:
    """The non-empty ``parts`` joined by ``-``, every run of other characters than ``[A-Za-z0-9._-]`` as ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(str(p) for p in parts if p))


def _wide(long: pd.DataFrame, index: list[str], cell) -> pd.DataFrame:
    """Pivot ``long`` to one row per ``index`` tuple and one column per p (descending); cells ``cell(row)``."""
    ps = sorted(long.p.unique(), reverse=True)
    grid: dict[tuple, dict[float, SimpleNamespace]] = {}
    for rec in long.to_dict("records"):  # one pass over plain Python records (fast on Arrow-backed strings)
        grid.setdefault(tuple(rec[c] for c in index), {})[rec["p"]] = SimpleNamespace(**rec)
    rows = [[*key, *(cell(by_p[p]) if p in by_p else "" for p in ps)] for key, by_p in sorted(grid.items())]
    return pd.DataFrame(rows, columns=[*index, *(f"p={p}" for p in ps)])


def _ceiling_note(gap: pd.DataFrame) -> str:
    """The gap table's note; it says why a gap can be negative when one is."""
    note = "Ceiling minus method, points (mean over tasks)."
    if (gap.gap < 0).any():
        note += (
            " A negative gap: the method scored above the ceiling. The query-aware ceiling keeps what the question "
            "and the "
            "full-cache answer need (that answer is its target), so it is a ceiling on keeping the full cache's "
            "answer, not on accuracy: where pruning changes an answer for the better (partial credit, or a full-cache "
            "answer that was wrong) a query-agnostic method can score above it."
        )
    return note


def _main(avg: pd.DataFrame, slug: str, title: str) -> Table:
    wide = T.main_table(avg)
    data = wide.drop(columns="best")
    shown = data.copy()
    for c in shown.columns[1:]:
        shown[c] = [_fmt(v) for v in data[c]]
    partial = set(avg.loc[avg.partial, "label"])
    bold = {(i, c) for i, cols in enumerate(wide.best) for c in cols}
    note = "Bold: the best method per column (the no-prune row `full` and query-aware ceilings are not ranked). "
    note += "`mean`: over the pruned kept fractions (p < 1) the row has."
    if partial:
        note += f" Some cells of {', '.join(sorted(partial))} average fewer tasks than the setting has."
    return Table(f"main-{slug}", f"Main table (mean over tasks, %) — {title}", data, shown, note, bold, "main")


def _ci(ci: pd.DataFrame, slug: str, title: str, ref: str) -> Table:
    def cell(r) -> str:
        return f"{r.diff:+.1f} [{r.lo:+.1f}, {r.hi:+.1f}]" + ("*" if r.significant else "")

    shown = _wide(ci, ["task", "label"], cell)
    note = (f"Paired bootstrap ({ci.n_contexts.max()} contexts at most per task, resampled by context): each "
            f"method's task score minus {ref}'s, points, with the 95 % percentile interval; * marks an interval "
            "that excludes 0.")  # fmt: skip
    return Table(f"ci-{slug}", f"Difference to {ref} with 95 % CI — {title}", ci, shown, note, kind="ci")


def _across(across: pd.DataFrame, agree: pd.DataFrame, key: tuple) -> list[Table]:
    """The across-models views of one GROUP (:func:`kvbench.report.terminal.across_shown`)."""
    title, slug = group_title(key), _group_slug(key)
    shown, note = across_shown(across)
    tables = [Table(f"across-{slug}", f"Across models (mean over {common_tasks(across)}) — {title}", across,
                    shown, note, kind="across")]  # fmt: skip
    if len(agree):
        shown, note = agreement_shown(agree)
        tables.append(Table(f"agreement-{slug}", f"Rank agreement across models — {title}", agree, shown, note,
                            kind="agreement"))  # fmt: skip
    return tables


def _sensitivity(sens: dict, key: tuple, slug: str, title: str) -> list[Table]:
    sel = {k: v[(v[SETTING] == pd.Series(key, index=SETTING)).all(axis=1)] for k, v in sens.items() if len(v)}
    if not sel or sel["per_task"].empty:
        return []
    per, means, order = sel["per_task"], sel["means"], sel["order"]
    out = [Table(f"scorer-tasks-{slug}", f"Official vs revised scorer per task — {title}", per,
                 _wide(per, ["task", "label"], lambda r: f"{r.score_official:.1f} → {r.score_revised:.1f}"),
                 "official → revised, %", kind="sens")]  # fmt: skip
    shown = _wide(means, ["label"], lambda r: f"{r.score_official:.1f} / {r.score_revised:.1f} ({r.delta:+.1f})")
    out.append(Table(f"scorer-means-{slug}", f"Mean over all tasks under each scorer — {title}", means, shown,
                     "official / revised (revised − official), %", kind="sens"))  # fmt: skip
    o = order.assign(order_official=order.order_official.map(" > ".join),
                     order_revised=order.order_revised.map(" > ".join))  # fmt: skip
    shown = o[["p", "same", "order_official", "order_revised"]].assign(same=o.same.map({True: "yes", False: "NO"}))
    shown = shown.sort_values("p", ascending=False).astype(str)
    n_same = int(order.same.sum())
    note = f"The order of the methods is the same under both scorers at {n_same} of {len(order)} kept fractions."
    out.append(Table(f"scorer-order-{slug}", f"Method order under each scorer — {title}", o, shown, note,
                     kind="sens"))  # fmt: skip
    return out


#: the first word of every table name the report writes besides the comparison's (``<method>-<setting>``)
_TABLE_KINDS = {"main", "ceiling", "ci", "scorer", "ablation", "memory", "counts", "across", "agreement", "cost"}


def _comparison(cmp: pd.DataFrame, method: str, slug: str, title: str) -> Table:
    """The "Every method against METHOD" table of one setting (``cmp``: :func:`tables.comparison_table` rows)."""
    col = method if method in cmp.columns else "compared"
    shown = _wide(cmp, ["label"], lambda r: f"{r.score:.1f} ({r.delta:+.1f})")
    means = cmp.groupby("label").agg(score=("score", "mean"), ref=(col, "mean"), s=("score_s", "first"),
                                     pf=("prefill_s", "first"), ratio=("score_over_prefill", "first"))  # fmt: skip
    shown["mean"] = [f"{means.score[lab]:.1f} ({means.score[lab] - means.ref[lab]:+.1f})" for lab in shown.label]
    shown["scoring s"] = [_fmt(means.s[lab], 3) for lab in shown.label]
    shown["prefill s"] = [_fmt(means.pf[lab], 3) for lab in shown.label]
    shown["scoring / prefill"] = [_fmt(means.ratio[lab], 3) for lab in shown.label]
    name = T.display_name(method)
    note = (f"Mean over tasks (%), in parentheses the difference to {name} (points); `mean` over the kept fractions "
            "shown; seconds: medians per context of the rows' scoring and prefill times.")  # fmt: skip
    stem = _file_name([method])
    stem = f"vs-{stem}" if stem in _TABLE_KINDS else stem
    return Table(f"{stem}-{slug}", f"Every method against {name} — {title}", cmp, shown, note, kind="comparison")


def _ablation(ab: pd.DataFrame, slug: str, title: str) -> Table:
    def cell(r) -> str:
        delta = "" if math.isnan(r.delta) else f" ({r.delta:+.1f})"
        return f"{r.score:.1f}{delta}" + ("*" * r.partial)

    shown = _wide(ab, ["method", "allocation"], cell)
    note = ("Mean over tasks (%), in parentheses the difference to the method's default allocation at the same p "
            "and total budget; * averages fewer tasks than the setting has.")  # fmt: skip
    unknown = sorted(set(ab.loc[ab.default == "", "method"]))
    if unknown:
        note += (
            f" No difference for {', '.join(unknown)}: its default allocation was not run, or is unknown here "
            "(rows of an older kvbench, method not installed)."
        )
    return Table(f"ablation-{slug}", f"Allocation ablation — {title}", ab, shown, note, kind="ablation")


def _memory(mem: pd.DataFrame, slug: str, title: str, opt: Options) -> Table:
    def cell(r) -> str:
        sessions = "n/a" if math.isnan(r.sessions) else f"{int(r.sessions):,}"
        return f"{r.kept_ratio:.3f} · {r.session_bytes / 2**30:.2f} GiB · {sessions}"

    shown = _wide(mem, ["label"], cell)
    weights = mem.weight_bytes.iloc[0]
    note = (f"Computed from measured bytes: kept ratio = measured stored / full K+V bytes of the rows; KV per "
            f"session = ratio × the model's attention K+V bytes per token ({mem.full_per_token.iloc[0]:,.0f} B; "
            f"measured {mem.measured_per_token.iloc[0]:,.0f} B at the run's length) × {opt.serve_length:,} tokens; "
            f"sessions = ⌊({opt.gpu_label} − weights) / KV per session⌋")  # fmt: skip
    note += (f", weights {weights / 1e9:.3f} GB." if not math.isnan(weights) else
             ": n/a, the manifest records no weight bytes for this model (rerun with this kvbench).")  # fmt: skip
    note += " GDN recurrent states (fixed per session) are not counted."
    return Table(f"memory-{slug}", f"Memory and serving (ratio · KV/session · sessions) — {title}", mem, shown,
                 note, kind="memory")  # fmt: skip


def _counts(cells: pd.DataFrame, slug: str, title: str) -> Table:
    shown = _wide(cells, ["task", "label"], lambda r: str(int(r.n)))
    return Table(f"counts-{slug}", f"Rows per cell — {title}", cells[["task", "label", "p", "n"]], shown,
                 "Rows (questions) that entered each cell.", kind="counts")  # fmt: skip


def _averaged_caption(rows: pd.DataFrame) -> str:
    """The caption of a setting's mean-over-tasks figure (``rows``: the setting's usable rows); where a task has
    sub-tasks, its bench's sentence on them (:attr:`kvbench.tasks.Bench.sub_task_caption`)."""
    from kvbench.tasks import BENCHES, Bench

    caption = "Each method's accuracy averaged over the section's tasks vs kept fraction."
    if "sub" in rows:
        for bench in sorted(set(rows.loc[rows["sub"].astype(str).ne(""), "bench"].astype(str))):
            cls = BENCHES.get(bench) if bench in BENCHES else Bench
            caption += " " + cls.sub_task_caption
    return caption


def _draw(job: tuple) -> tuple[bytes, bytes]:
    """One figure as (PNG, PDF) bytes. ``job``: ``("averaged", avg, title, palette)``, ``("tasks", cells,
    title, palette, bands)`` or ``("across", across, title, palette, names)``; module-level so that worker
    processes can run it."""
    import io

    kind, frame, title, palette, *rest = job
    draw = {"averaged": F.averaged_curves, "tasks": F.per_task_curves, "across": F.across_curves}[kind]
    fig = draw(frame, *rest, title, palette) if kind == "across" else draw(frame, title, palette, *rest)
    png, pdf = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png", dpi=110, **F.SAVE_OPTIONS)  # a long title widens the canvas, never cut
    fig.set_layout_engine("none")  # keep the constrained layout just computed: the PDF is not laid out again
    fig.savefig(pdf, format="pdf", **F.SAVE_OPTIONS)
    return png.getvalue(), pdf.getvalue()


def _draw_all(jobs: list[tuple]) -> list[tuple[bytes, bytes]]:
    """:func:`_draw` of every job, in order: by one process per CPU core (at most 8) when there are several."""
    from concurrent.futures import ProcessPoolExecutor

    from kvbench.report.data import cpu_workers, mp_context

    workers = min(len(jobs), cpu_workers())
    if workers < 2:
        return [_draw(job) for job in jobs]
    with ProcessPoolExecutor(workers, mp_context=mp_context()) as pool:
        return list(pool.map(_draw, jobs))


def _choose(
    present: set[str],
    given: str | None,
    default: str | None,
    fallback: tuple[str | None, str],
    role: str,
    option: str,
    without: str,
) -> tuple[str | None, list[str]]:
    """One method setting: ``given``, else ``default`` when the rows have it, else ``fallback`` (method, why);
    a note for every outcome but a present default or a present given method (``without``: what the report
    lacks when the method has no rows)."""
    if given is not None:
        if given in present:
            return given, []
        return given, [f"{role} {given} ({option} {given}) has no rows here: {without}"]
    if default in present:
        return default, []
    method, why = fallback
    if method is None:
        return None, [f"{role}: none, the rows have no {default} and no method to stand in for it: {without}"]
    return method, [f"{role}: {method}, {why} (the rows have no {default}; {option} METHOD names another)"]


def choose_methods(avg: pd.DataFrame, opt: Options) -> tuple[str | None, str | None, list[str]]:
    """The CI reference and the comparison method of the report, and the notes that state any other choice
    than a default the rows have. Defaults: ``opt.default_reference`` when the rows have it, else the ranked
    method of the best mean over the pruned kept fractions (:func:`tables.best_method`); ``opt.default_compare``
    when the rows have it, else the CI reference. ``avg``: :func:`tables.averaged` of the usable rows."""
    present = set(avg.method.astype(str)) if len(avg) else set()
    best = (T.best_method(avg) if len(avg) else None, "the best mean over the pruned kept fractions")
    ref, notes = _choose(present, opt.reference, opt.default_reference, best, "CI reference", "--reference",
                         "no confidence intervals")  # fmt: skip
    stand_in = (ref if ref in present else None, "the CI reference")
    cmp, more = _choose(present, opt.compare, opt.default_compare, stand_in, "comparison", "--compare",
                        'no "Every method against" tables')  # fmt: skip
    return ref, cmp, notes + more


def build(df: pd.DataFrame, missing: dict[str, str], notes: list[str], manifests: list[dict], opt: Options) -> Report:
    """Every view of the report from the rows ``df`` (``data.load``), ``missing.json`` entries, loader notes and
    the manifests' run entries."""
    header = [counts_line(df)]
    if is_random(df):
        header.append(RANDOM_WARNING.strip("*"))
    header += notes + [line.replace("**", "") for line in missing_lines(df, missing)]
    use = usable(df)
    cells = T.task_scores(use)
    avg = T.averaged(cells)
    ref, cmp, chosen = choose_methods(avg, opt)
    present, left_out = set(avg.method.astype(str)) if len(avg) else set(), []
    ci = T.paired_bootstrap(use, ref or "", opt.n_resamples, opt.seed)
    sens = T.scorer_sensitivity(use)
    against = T.comparison_table(use, avg, cmp or "")
    ab = T.allocation_ablation(avg, T.recorded_defaults(use))
    gap = T.ceiling_gap(avg)
    shapes = {(r.get("model"), r.get("model_fingerprint") or ""): r["model_shape"] for r in manifests
              if isinstance(r.get("model_shape"), dict)}  # fmt: skip
    mem = T.memory_view(use, shapes, opt.gpu_bytes, opt.serve_length)
    palette = F.colors(sorted(set(cells.label))) if len(cells) else {}
    sections = []
    jobs: list[tuple] = []  # figures to draw: (section index, block index, name, title, caption, job)

    def of(frame: pd.DataFrame, key: tuple) -> pd.DataFrame:
        if frame.empty:
            return frame
        return frame[(frame[SETTING].astype(str) == pd.Series(key, index=SETTING)).all(axis=1)]

    for key, c in cells.groupby(SETTING, sort=True):
        title, slug = setting_title(key, sorted(c.task.unique())), _slug(key)
        sec = Section(title)
        a, b = of(avg, key), of(ci, key)
        if opt.figures:
            job = ("averaged", a, f"mean over {a.n_tasks.max()} tasks — {title}", palette)
            jobs.append((len(sections), len(sec.blocks), f"averaged-{slug}", "Mean over tasks",
                         _averaged_caption(of(use, key)), job))  # fmt: skip
            sec.blocks.append(None)  # drawn below, with every other figure
            band = f"; bands: paired 95 % bootstrap intervals of the difference to {ref}" if len(b) else ""
            job = ("tasks", c, title, palette, b if len(b) else None)
            jobs.append((len(sections), len(sec.blocks), f"tasks-{slug}", "Per task",
                         f"Accuracy vs kept fraction{band}.", job))  # fmt: skip
            sec.blocks.append(None)
        sec.blocks.append(_main(a, slug, title))
        g = of(gap, key)
        if len(g):
            shown = _wide(g, ["ceiling", "label"], lambda r: f"{r.gap:+.1f}")
            sec.blocks.append(Table(f"ceiling-{slug}", f"Gap to the query-aware ceiling — {title}", g, shown,
                                    _ceiling_note(g), kind="ceiling"))  # fmt: skip
        if len(b):
            sec.blocks.append(_ci(b, slug, title, b.reference.iloc[0]))
        elif ref in present:
            left_out.append(f"{title}: no confidence intervals (no {ref} rows paired with another method's there)")
        sec.blocks += _sensitivity(sens, key, slug, title)
        if len(k := of(against, key)):
            sec.blocks.append(_comparison(k, cmp, slug, title))
        elif cmp in present:
            left_out.append(f'{title}: no "Every method against {T.display_name(cmp)}" table (no {cmp} rows there)')
        if len(x := of(ab, key)):
            sec.blocks.append(_ablation(x, slug, title))
        if len(m := of(mem, key)):
            sec.blocks.append(_memory(m, slug, title, opt))
        sec.blocks.append(_counts(c, slug, title))
        sections.append(sec)
    for key, g, a in T.across_groups(cells):
        sec = Section(f"Across models — {group_title(key)}", _across(g, a, key))
        if opt.figures:
            job = ("across", g, f"mean over {common_tasks(g)} — {group_title(key)}", palette, T.model_names(g))
            caption = ("Each model's panel: every method's mean over the tasks all models have; a method that "
                       "lacks one of them on a model is not drawn there.")  # fmt: skip
            jobs.append((len(sections), 0, f"models-{_group_slug(key)}", "Side by side across models", caption, job))
            sec.blocks.insert(0, None)
        sections.append(sec)
    for (i, j, name, fig_title, caption, _), (png, pdf) in zip(jobs, _draw_all([x[-1] for x in jobs]), strict=True):
        sections[i].blocks[j] = Figure(name, fig_title, png, pdf, caption)
    if opt.cost:
        cost = T.cost_table(opt.cost)
        shown = cost.assign(
            prefill_s=cost.prefill_s.map(lambda v: _fmt(v, 3)),
            score_s=cost.score_s.map(lambda v: _fmt(v, 4)),
            ratio=cost.ratio.map(lambda v: _fmt(v, 4)),
        )
        meta = opt.cost.get("meta", {})
        note = f"`kvbench cost` on {meta.get('model', '?')}: median seconds of {meta.get('repeats', '?')} runs."
        sections.append(Section("Scoring cost", [Table("cost", "Scoring cost by context length", cost,
                                                       shown.astype(str), note, kind="cost")]))  # fmt: skip
    notes = chosen + left_out
    return Report(header + notes, sections, render_markdown(df, missing, across=False), notes)  # across: sections


# --- writers ---------------------------------------------------------------------------------------------------

_TEX = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
        "^": r"\textasciicircum{}", "\\": r"\textbackslash{}", "→": r"$\to$", "−": "-", "·": r"$\cdot$",
        "⌊": "", "⌋": ""}  # fmt: skip


def _tex_escape(text: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(text))


def to_latex(t: Table) -> str:
    """``t.shown`` as a booktabs tabular (bold cells as ``\\textbf``); needs ``\\usepackage{booktabs}``."""
    cols = list(t.shown.columns)
    spec = "".join("l" if not (c.startswith("p=") or c == "mean") else "r" for c in cols)
    lines = [f"% {t.title}", f"\\begin{{tabular}}{{{spec}}}", "\\toprule", " & ".join(map(_tex_escape, cols)) + r" \\",
             "\\midrule"]  # fmt: skip
    for i, row in enumerate(t.shown.itertuples(index=False)):
        cells = [_tex_escape(v) for v in row]
        cells = [f"\\textbf{{{v}}}" if (i, c) in t.bold else v for v, c in zip(cells, cols, strict=True)]
        lines.append(" & ".join(cells) + r" \\")
    lines += ["\\bottomrule", "\\end{tabular}", ""]
    return "\n".join(lines)


def to_markdown(t: Table) -> str:
    cols = list(t.shown.columns)
    out = [f"### {t.title}", "", "| " + " | ".join(cols) + " |", "|---" + "|---:" * (len(cols) - 1) + "|"]
    for i, row in enumerate(t.shown.itertuples(index=False)):
        cells = [f"**{v}**" if (i, c) in t.bold and v else str(v) for v, c in zip(row, cols, strict=True)]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out + ["", t.note, ""] if t.note else out + [""])


def to_html(t: Table) -> str:
    cols = list(t.shown.columns)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = []
    for i, row in enumerate(t.shown.itertuples(index=False)):
        tds = []
        for v, c in zip(row, cols, strict=True):
            text = html.escape(str(v))
            tds.append(f"<td><strong>{text}</strong></td>" if (i, c) in t.bold and v != "" else f"<td>{text}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return (f'<table class="{t.kind}" id="{html.escape(t.name)}" data-csv="tables/{html.escape(t.name)}.csv">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")  # fmt: skip


def write(report: Report, out_dir: Path) -> Path:
    """Write the report directory; return the path of ``index.html``."""
    import jinja2

    out_dir = Path(out_dir)
    (out_dir / "tables").mkdir(parents=True, exist_ok=True)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    md = [report.markdown_head.rstrip(), ""]
    if report.notes:
        md += ["## Notes", "", *(f"- {note}" for note in report.notes), ""]
    for sec in report.sections:
        md += [f"## {sec.title} (report)", ""]
        for b in sec.blocks:
            if isinstance(b, Table):
                write_atomic(out_dir / "tables" / f"{b.name}.csv", b.data.to_csv(index=False))
                write_atomic(out_dir / "tables" / f"{b.name}.tex", to_latex(b))
                md.append(to_markdown(b))
            else:
                write_atomic(out_dir / "figures" / f"{b.name}.png", b.png)
                write_atomic(out_dir / "figures" / f"{b.name}.pdf", b.pdf)
                md += [f"![{b.title}](figures/{b.name}.png)", "", b.caption, ""]
    write_atomic(out_dir / "report.md", "\n".join(md))
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("kvbench.report", "templates"), autoescape=jinja2.select_autoescape(["html"])
    )
    page = env.get_template("index.html.j2").render(
        header=report.header,
        sections=[
            (sec.title, [("table", b, to_html(b)) if isinstance(b, Table) else
                         ("figure", b, base64.b64encode(b.png).decode("ascii")) for b in sec.blocks])
            for sec in report.sections
        ],
    )  # fmt: skip
    index = out_dir / "index.html"
    write_atomic(index, page)
    return index
