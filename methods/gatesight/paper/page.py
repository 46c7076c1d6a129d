"""The ``kvbench paper`` page: ``paper.md``, ``index.html`` (self-contained, figures embedded) and
``figures/*.png|pdf``, the artifacts in the paper's order. Each artifact shows the paper's numbers beside the
measured ones, the verdict on each of its findings with the numbers that decide it, its figures, or the reason it
is not reproduced. At ``--scale tiny`` every measured number is labelled a tiny-model number.

The page is built as a list of blocks (:class:`Block`) rendered twice, to Markdown and to HTML; the figures reuse
:mod:`kvbench.report.figures` (accuracy curves) and :mod:`kvbench.report.tables` (task scores, averages).
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.methods.gatesight.paper.artifacts import Plan, PlannedArtifact, model_roles
from kvbench.methods.gatesight.paper.evidence import Evidence
from kvbench.methods.gatesight.paper.numbers import PaperNumbers, spec_key
from kvbench.methods.gatesight.paper.verdicts import STATES, Verdict, evaluate

__all__ = ["Block", "build_page", "render_html", "render_markdown", "write_page"]


@dataclass
class Block:
    """One piece of the page: ``kind`` h1 | h2 | p | note | table (``rows``, ``headers``) | list (``rows``: lines)
    | figure (``text``: caption, ``path``: PNG)."""

    kind: str
    text: str = ""
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    path: Path | None = None
    anchor: str = ""


def _num(v: float | None, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if unit == "s":
        return f"{v:.3f}"
    if unit == "tokens":
        return f"{v:.3g}"
    if unit == "" and abs(v) < 10:
        return f"{v:+.3f}" if abs(v) < 1 else f"{v:.2f}"
    return f"{v:.1f}"


def _label(scale: str, model: str) -> str:
    return f"kvbench, {model} (tiny-model number)" if scale == "tiny" else f"kvbench, {model}"


def _compare_table(
    values: list[dict], measured: dict[str, float], roles: dict[str, str], scale: str, paper_models: dict[str, str]
) -> Block:
    rows = []
    for v in values:
        role = v["measure"]["model"]
        model = roles.get(role)
        got = measured.get(spec_key(v["measure"])) if model else None
        unit = v["unit"] if v["unit"] != "%" else "%"
        measured_text = _num(got, v["unit"]) if model else "— (no model in this role)"
        if v["measure"]["kind"] == "text":
            measured_text = f"— ({v['measure']['reason']})"
        rows.append(
            [
                v["source"],
                v["row"],
                v["column"],
                f"{_num(v['value'], v['unit'])}{'' if unit in ('', 's') else ' ' + unit}",
                f"{paper_models[role]}",
                measured_text,
                (model or "—") + (" (tiny)" if model and scale == "tiny" else ""),
            ]
        )
    headers = [
        "source",
        "row",
        "column",
        "paper",
        "paper's model",
        "measured (tiny-model number)" if scale == "tiny" else "measured",
        "measured on",
    ]
    return Block("table", headers=headers, rows=rows)


def _interval_text(c) -> str:
    iv = c.interval
    if iv is None:
        return f"{_num(c.d)} (point)"
    return f"{_num(c.d)} [{_num(iv.lo)}, {_num(iv.hi)}], width {abs(iv.width):.3g}"


def _verdict_blocks(verdicts: list[Verdict], scale: str) -> list[Block]:
    """Per finding: its state and sentence, its rule in words, and a table of every comparison of every case with
    kvbench's difference, its interval and width, n, the paper's own difference and the comparison's state."""
    out: list[Block] = []
    for vd in verdicts:
        f = vd.finding
        text = f"**{vd.status}** — {f['text']} ({f['source']}). Rule: {vd.rule}."
        if vd.note:
            text += f" Note: {vd.note}."
        out.append(Block("list", rows=[[text]]))
        rows = []
        for case in vd.cases:
            where = ", ".join(f"{k}={v}" for k, v in case.binding.items())
            for c in case.comparisons:
                paper = _num(c.paper) if c.paper is not None else "—"
                state = c.state + (f" ({c.floor})" if c.floor else "")
                rows.append([where, c.text, paper, _interval_text(c), c.n, state])
            if case.missing:
                rows.append([where, "not measured: " + "; ".join(case.missing), "", "", "", "missing"])
        if rows:
            tiny = " (tiny-model number)" if scale == "tiny" else ""
            headers = ["case", "comparison (d > 0: the finding's side)", "paper", f"kvbench d [95 % interval]{tiny}",
                       "n", "state"]  # fmt: skip
            out.append(Block("table", headers=headers, rows=rows))
    return out


def _fig_path(out: Path, stem: str, fig: Any) -> Path:
    from kvbench.report.figures import save

    paths = save(fig, out / "figures" / stem)
    return paths[0]


def _accuracy_figures(art: PlannedArtifact, df: Any, p: Plan, out: Path, scale: str) -> list[Block]:
    from kvbench.methods.gatesight.paper.measure import accuracy_cells
    from kvbench.report import figures as F
    from kvbench.report import tables as T

    blocks = []
    tag = " — tiny-model numbers" if scale == "tiny" else ""
    for grid in art.grids:
        if grid.kind != "run":
            continue
        for model in p.models_of(grid):
            cells = accuracy_cells(df, grid, model) if df is not None else None
            if cells is None or cells.empty:
                blocks.append(Block("note", f"{grid.name} on {model}: no result rows yet"))
                continue
            palette = F.colors(sorted(set(cells.label)))
            if art.artifact.section in ("per_task", "allocation"):
                fig = F.per_task_curves(cells, f"{art.artifact.title}: {grid.bench}, {model}{tag}", palette)
                caption = f"per-task accuracy vs p, {grid.bench}, {model}"
            else:
                fig = F.averaged_curves(T.averaged(cells), f"{art.artifact.title}: {grid.bench}, {model}{tag}", palette)
                caption = f"mean accuracy over {len(set(cells.task))} tasks vs p, {grid.bench}, {model}"
            path = _fig_path(out, f"{art.artifact.id}-{grid.name}-{model.replace('/', '__')}", fig)
            blocks.append(Block("figure", caption + (" (tiny-model numbers)" if scale == "tiny" else ""), path=path))
    return blocks


def _method_table(art: PlannedArtifact, measured: dict[str, float], p: Plan) -> list[Block]:
    """Every method (or allocation) of the artifact's run grids at p = 0.7, 0.4, 0.1 and the nine-p mean, and each
    one's difference (points) to the comparison arm at p = 0.1 and on the mean: KVzip for the method grids (Table
    3), the gate-proportional allocation for the allocation grids (Table 4)."""
    roles = model_roles(p.models)
    cols = [0.7, 0.4, 0.1, "mean"]
    rows = []
    for grid in art.grids:
        if grid.kind != "run":
            continue
        for role, model in roles.items():
            if model not in p.models_of(grid):
                continue
            if grid.allocations:
                arms = [(a, "gatesight", {"allocation": a}) for a in grid.allocations]
            else:
                arms = [(m, m, {}) for m in grid.methods]
            base = {"kind": "accuracy", "grid": grid.name, "model": role}
            table = {name: [measured.get(spec_key({**base, "method": m, "p": c, **x})) for c in cols]
                     for name, m, x in arms}  # fmt: skip
            ref = table[arms[0][0] if grid.allocations else "kvzip"] if (grid.allocations or "kvzip" in table) else None
            for name, vals in table.items():
                deltas = [
                    None if ref is None or v is None or r is None else v - r
                    for v, r in zip(vals[2:], ref[2:], strict=True)
                ]
                rows.append([grid.name, model, name, *[_num(v, "%") for v in vals],
                             *[("—" if d is None else f"{d:+.1f}") for d in deltas]])  # fmt: skip
    if not rows:
        return []
    against = "gate" if art.artifact.id == "table4" else "KVzip"
    headers = ["grid", "model", "method / allocation",
               *[f"{c}{_tiny(p.scale)}" for c in ("p = 0.7", "p = 0.4", "p = 0.1", "mean")],
               f"vs {against} at p = 0.1", f"vs {against}, mean"]  # fmt: skip
    return [Block("table", headers=headers, rows=rows)]


def _tiny(scale: str) -> str:
    """The label every measured column carries at tiny scale."""
    return " (tiny-model number)" if scale == "tiny" else ""


def _cost_table(raw: dict, scale: str) -> list[Block]:
    rows = []
    for model, data in raw.get("cost", {}).items():
        for r in data.get("rows", []):
            rows.append(
                [
                    model,
                    r["method"],
                    str(r["length"]),
                    f"{r['prefill_s']:.3f}",
                    f"{r['score_s']:.4f}",
                    f"{100 * r['ratio']:.2f} %",
                ]
            )
    if not rows:
        return []
    return [
        Block(
            "table",
            headers=[
                "model",
                "method",
                "length",
                *[f"{c}{_tiny(scale)}" for c in ("prefill s", "scoring s", "scoring / prefill")],
            ],
            rows=rows,
        )
    ]


def _dynamics_figure(raw: dict, out: Path, scale: str) -> list[Block]:
    from matplotlib.figure import Figure

    blocks = []
    for (model, set_name), data in raw.get("dynamics", {}).items():
        if set_name != "short" or not data.get("head_median"):
            continue
        layers = data.get("gdn_layers") or 1
        med = data["head_median"]
        per = len(med) // layers
        fig = Figure(figsize=(6, 3.2), layout="constrained")
        ax = fig.subplots()
        for layer in range(layers):
            hs = [min(h, 1e7) for h in med[layer * per : (layer + 1) * per]]
            ax.scatter([layer] * len(hs), hs, s=8, color="tab:blue")
        ax.set_yscale("log")
        ax.set_xlabel("GDN layer")
        ax.set_ylabel("median half-life (tokens)")
        ax.set_title(f"Figure 1a: {model}" + (" — tiny-model numbers" if scale == "tiny" else ""), fontsize=9)
        path = _fig_path(out, f"fig1-{model.replace('/', '__')}", fig)
        slow = ", ".join(f"{data.get(f'slow_heads@{t}', 0)} at {t}" for t in (300, 1000, 4000))
        blocks.append(
            Block(
                "figure",
                f"per-head median half-life over {data['documents']} documents, {model}; slow heads: {slow} tokens",
                path=path,
            )
        )
    return blocks


def _per_layer_figure(raw: dict, out: Path, scale: str) -> list[Block]:
    from matplotlib.figure import Figure

    blocks = []
    for (model, grid), data in raw.get("eval", {}).items():
        if grid != "eval-short-w6":
            continue
        fig = Figure(figsize=(8, 3.2), layout="constrained")
        axes = fig.subplots(1, 2)
        layers = data.get("attn_layer_ids", [])
        for name, pred in data["predictors"].items():
            per = pred.get("per_layer", [])
            axes[0].plot(layers, [x["rho"] for x in per], marker="o", label=name)
            axes[1].plot(layers, [100 * x["ov@10"] for x in per], marker="o", label=name)
        axes[0].set_ylabel("Spearman ρ with U")
        axes[1].set_ylabel("top-10 % overlap (%)")
        for ax in axes:
            ax.set_xlabel("attention layer")
        axes[1].legend(fontsize=6)
        fig.suptitle(f"Figure 8: {model}" + (" — tiny-model numbers" if scale == "tiny" else ""), fontsize=9)
        path = _fig_path(out, f"fig8-{model.replace('/', '__')}", fig)
        blocks.append(Block("figure", f"per attention layer, every predictor, {model}", path=path))
    return blocks


def _signal_figure(raw: dict, out: Path, scale: str) -> list[Block]:
    from matplotlib.figure import Figure

    names = [
        "β, window mean",
        "−g, window mean",
        "‖v‖, preceding GDN layer",
        "β‖v‖, window mean",
        "‖v‖ into slow heads",
        "slow-head β‖v‖",
    ]
    blocks = []
    for (model, grid), data in raw.get("eval", {}).items():
        if grid != "eval-short-w6":
            continue
        vals = [data["predictors"].get(n, {}).get("layer_mean", {}).get("rho", math.nan) for n in names]
        fig = Figure(figsize=(6, 3.0), layout="constrained")
        ax = fig.subplots()
        ax.bar(range(len(names)), [0 if v != v else v for v in vals], color="tab:blue")
        ax.set_xticks(range(len(names)), ["β", "−g", "‖v‖", "β‖v‖", "‖v‖s", "β‖v‖s"])
        ax.set_ylabel("Spearman ρ with U")
        ax.set_title(f"Figure 2a: {model}" + (" — tiny-model numbers" if scale == "tiny" else ""), fontsize=9)
        path = _fig_path(out, f"fig2-{model.replace('/', '__')}", fig)
        blocks.append(Block("figure", f"native signals against U (layer means), {model}", path=path))
    return blocks


def _cells_figure(raw: dict, out: Path, scale: str) -> list[Block]:
    """Figure 6: every window cell's ρ(β‖v‖, U), sorted, one panel per attention layer."""
    from matplotlib.figure import Figure

    from kvbench.methods.gatesight.paper.measure import CELL_RHO

    blocks = []
    for model, data in raw.get("cells", {}).items():
        panels = [(f, w) for f, w in enumerate(data["windows"]) if w]
        if not panels:
            continue
        fig = Figure(figsize=(3 * len(panels), 3.0), layout="constrained")
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, (f, win) in zip(axes, panels, strict=True):
            rho = data["cell_rho"][f]
            for j in win:
                ax.plot(sorted(rho[j]), marker=".", label=f"GDN {data['gdn_layer_ids'][j]}")
            for y in (-CELL_RHO, CELL_RHO):
                ax.axhline(y, color="grey", lw=0.6, ls="--")
            ax.set_title(f"attention layer {data['attn_layer_ids'][f]}", fontsize=8)
            ax.set_xlabel("GDN head, sorted")
        axes[0].set_ylabel("Spearman ρ(β‖v‖, U)")
        axes[-1].legend(fontsize=6)
        fig.suptitle(f"Figure 6: {model}" + (" — tiny-model numbers" if scale == "tiny" else ""), fontsize=9)
        path = _fig_path(out, f"fig6-{model.replace('/', '__')}", fig)
        caption = f"per-cell correlation in each attention layer's window, {data['n_documents']} documents, {model}"
        blocks.append(Block("figure", caption, path=path))
    return blocks


def _best_layer_blocks(raw: dict, out: Path, scale: str) -> list[Block]:
    """Figure 7: per attention layer, the ρ of each preceding GDN layer's effective write with U, the best one
    and the estimator's window."""
    blocks = []
    for model, data in raw.get("cells", {}).items():
        gdn, rows = data["gdn_layer_ids"], []
        for f, (best, win) in enumerate(zip(data["best_layer"], data["windows"], strict=True)):
            if best is None:
                continue
            rho = data["layer_rho"][f]
            inside = max((rho[j] for j in win), default=math.nan)
            rows.append([model, str(data["attn_layer_ids"][f]), ", ".join(str(gdn[j]) for j in win) or "—",
                         str(gdn[best]), _num(rho[best]), _num(inside), "no" if best in win else "yes"])  # fmt: skip
        if rows:
            tiny = _tiny(scale)
            headers = ["model", "attention layer", "window (GDN layers)", "best preceding GDN layer",
                       f"its ρ{tiny}", f"best ρ inside the window{tiny}", "outside the window"]  # fmt: skip
            blocks.append(Block("table", headers=headers, rows=rows))
    return blocks


def _decile_table(raw: dict, scale: str) -> list[Block]:
    """Figure 2c: top / bottom decile lift of the slow-head and window-mean β‖v‖."""
    rows = []
    for model, data in raw.get("cells", {}).items():
        lifts = data.get("decile_lift", {})
        for name in ("slow-head β‖v‖", "β‖v‖, window mean"):
            if name in lifts:
                rows.append([model, name, f"{lifts[name]['top']:.2f}×", f"{lifts[name]['bottom']:.2f}×"])
            else:
                rows.append([model, name, "— (no slow head on this model)", "—"])
    if not rows:
        return []
    headers = ["model", "signal", f"top decile lift{_tiny(scale)}", f"bottom decile lift{_tiny(scale)}"]
    return [Block("p", "Figure 2c, decile lift over chance:"), Block("table", headers=headers, rows=rows)]


def build_page(
    p: Plan,
    numbers: PaperNumbers,
    measured: dict[str, float],
    raw: dict,
    df: Any,
    out: Path,
    timings: list | None = None,
) -> tuple[list[Block], list[Verdict]]:
    """The page's blocks (figures written under ``out/figures``) and every finding's verdict (paired intervals from
    the rows of ``df`` and the evaluations in ``raw``)."""
    roles = model_roles(p.models)
    evidence = Evidence(p, df, raw)
    paper = {spec_key(v["measure"]): float(v["value"]) for v in numbers.values}
    scale = p.scale
    verdicts_all: list[Verdict] = []
    blocks = [Block("h1", "The GateSight paper, reproduced by kvbench")]
    if scale == "tiny":
        blocks.append(
            Block(
                "note",
                "Every measured number on this page is a TINY-MODEL NUMBER: kvbench's 4.6M-parameter "
                f"shipped models ({', '.join(p.models)}), trained on synthetic data on 2 CPU cores, on small "
                "grids. They check that each experiment runs and whether a finding's direction shows at "
                "this scale; they are not the paper's measurements and say nothing about its models.",
            )
        )
    blocks.append(
        Block(
            "p",
            f"Paper: {numbers.paper['title']} (arXiv {numbers.paper['arxiv']}). Measured models: "
            + "; ".join(f"{m} in the role of the paper's {numbers.models[r]}" for r, m in roles.items()),
        )
    )
    summary_at = len(blocks)
    for pa in p.artifacts:
        art = pa.artifact
        blocks.append(Block("h2", f"{art.title}: {art.caption}", anchor=art.id))
        if pa.reason:
            blocks.append(Block("note", f"Not reproduced at --scale {scale}: {pa.reason}"))
        if pa.partial:
            blocks.append(Block("note", f"Partly reproduced: {pa.partial}"))
        values = numbers.for_artifact(art.id)
        if values:
            blocks.append(Block("p", "The paper's numbers beside kvbench's:"))
            blocks.append(_compare_table(values, measured, roles, scale, numbers.models))
        verdicts = [evaluate(f, measured, roles, evidence, paper) for f in numbers.findings_for(art.id)]
        verdicts_all += verdicts
        if verdicts:
            blocks.append(Block("p", "Findings:"))
            blocks += _verdict_blocks(verdicts, scale)
        if pa.reason:
            continue
        section = art.section
        if section in ("curves", "per_task", "allocation"):
            blocks += _accuracy_figures(pa, df, p, out, scale)
        if section in ("kvzip", "allocation"):
            blocks += _method_table(pa, measured, p)
        if section == "cost":
            blocks += _cost_table(raw, scale)
        if section == "dynamics":
            blocks += _dynamics_figure(raw, out, scale)
        if section == "signals":
            blocks += _signal_figure(raw, out, scale) + _decile_table(raw, scale)
        if section == "cells":
            blocks += _cells_figure(raw, out, scale)
        if section == "best_layer":
            blocks += _best_layer_blocks(raw, out, scale)
        if section == "per_layer":
            blocks += _per_layer_figure(raw, out, scale)
    counts = {s: sum(v.status == s for v in verdicts_all) for s in STATES}
    blocks.insert(
        summary_at,
        Block(
            "p",
            "Findings: "
            + ", ".join(f"{n} {s}" for s, n in counts.items())
            + f", of {len(verdicts_all)}. A verdict is about the paper's direction or order, judged by paired "
            "bootstrap 95 % intervals over the same contexts (or corpora); the paper's magnitudes stand beside "
            "kvbench's and are thresholds only where the paper's claim is itself a scale-free number.",
        ),
    )
    if timings:
        rows = [[g, m, f"{s:.0f}"] for g, m, s in timings]
        blocks += [
            Block("h2", "Stages run", anchor="stages"),
            Block("table", headers=["grid", "model", "seconds"], rows=rows),
        ]
    return blocks, verdicts_all


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(blocks: list[Block], out: Path) -> str:
    """``paper.md``'s text (figure paths relative to ``out``)."""
    lines: list[str] = []
    for b in blocks:
        if b.kind == "h1":
            lines += [f"# {b.text}", ""]
        elif b.kind == "h2":
            lines += [f"## {b.text}", ""]
        elif b.kind in ("p", "note"):
            lines += [("> " if b.kind == "note" else "") + b.text, ""]
        elif b.kind == "table":
            lines.append("| " + " | ".join(map(_md_cell, b.headers)) + " |")
            lines.append("|" + "---|" * len(b.headers))
            lines += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in b.rows]
            lines.append("")
        elif b.kind == "list":
            lines += [f"- {r[0]}" for r in b.rows] + [""]
        elif b.kind == "figure" and b.path is not None:
            lines += [f"![{b.text}]({b.path.relative_to(out).as_posix()})", "", f"*{b.text}*", ""]
    return "\n".join(lines)


_CSS = (
    "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px}"
    "th{background:#f0f0f0}.note{background:#fff6d5;border-left:4px solid #e0b000;padding:.4em .8em}"
    "img{max-width:100%}figure{margin:1em 0}nav a{margin-right:.8em}"
)


def _inline(text: str) -> str:
    out = html.escape(text)
    parts = out.split("**")
    return "".join(f"<strong>{s}</strong>" if i % 2 else s for i, s in enumerate(parts))


def render_html(blocks: list[Block]) -> str:
    """``index.html``: one self-contained page (figures embedded as data URIs, no network)."""
    body: list[str] = []
    nav = [
        f'<a href="#{b.anchor}">{html.escape(b.text.split(":")[0])}</a>' for b in blocks if b.kind == "h2" and b.anchor
    ]
    for b in blocks:
        if b.kind == "h1":
            body.append(f"<h1>{html.escape(b.text)}</h1><nav>{''.join(nav)}</nav>")
        elif b.kind == "h2":
            body.append(f'<h2 id="{html.escape(b.anchor)}">{html.escape(b.text)}</h2>')
        elif b.kind == "p":
            body.append(f"<p>{_inline(b.text)}</p>")
        elif b.kind == "note":
            body.append(f'<p class="note">{_inline(b.text)}</p>')
        elif b.kind == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b.headers)
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in b.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif b.kind == "list":
            body.append("<ul>" + "".join(f"<li>{_inline(r[0])}</li>" for r in b.rows) + "</ul>")
        elif b.kind == "figure" and b.path is not None:
            data = base64.b64encode(b.path.read_bytes()).decode()
            body.append(
                f'<figure><img alt="{html.escape(b.text)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{html.escape(b.text)}</figcaption></figure>"
            )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>kvbench paper</title>'
        f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )


def write_page(blocks: list[Block], out: Path) -> Path:
    """Write ``out/paper.md`` and ``out/index.html``; return the HTML path."""
    from kvbench.atomic import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "paper.md", render_markdown(blocks, out))
    index = out / "index.html"
    write_atomic(index, render_html(blocks))
    return index
