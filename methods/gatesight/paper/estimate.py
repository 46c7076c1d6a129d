"""The dry run: each grid's counts (contexts, children, answers, documents) and its estimated seconds from
measured per-context costs (``costs.json``, recorded from docs/cost.md and docs/models.md, or a results store's
timing columns: :func:`costs_from_rows`). A time is given only where every cost it needs is known; otherwise the
grid is counted and said to have no known cost. Pure functions (no torch, no model)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

from kvbench.methods.gatesight.paper.artifacts import Grid, Plan

__all__ = ["Estimate", "costs_from_rows", "estimate_grid", "format_dry_run", "format_minutes", "load_costs"]

_KINDS_PER_CORPUS = 3  # kvbench.tasks.calibration_corpus.CALIBRATION_KINDS: haystack, words, assignments


def load_costs() -> dict:
    """The packaged ``costs.json``, with ``same_as`` entries resolved."""
    data = json.loads(resources.files(__package__).joinpath("costs.json").read_text(encoding="utf-8"))
    for section in ("run", "cost"):
        for name, entry in list(data.get(section, {}).items()):
            if "same_as" in entry:
                data[section][name] = {**data[section][entry["same_as"]], "source": entry["source"]}
    return data


@dataclass(frozen=True)
class Estimate:
    """One grid on one model: ``counts`` (what it runs, in words), ``seconds`` (None: no known cost), ``why`` (the
    cost's source or why it is unknown)."""

    grid: Grid
    model: str
    counts: str
    seconds: float | None
    why: str


def _run_estimate(grid: Grid, model: str, costs: dict) -> Estimate:
    contexts = len(grid.tasks) * grid.limit
    pruned = [m for m in grid.methods if m != "full"]
    children = len(pruned) * len(grid.allocations or ("",)) * len(grid.ps) + 1  # + the no-prune reference
    answers = contexts * children * grid.questions
    counts = (
        f"n = {grid.limit} contexts per task, {contexts} contexts x {children} children x {grid.questions} "
        f"question(s) = {answers} answers"
    )
    c = costs.get("run", {}).get(model)
    if c is None:
        return Estimate(grid, model, counts, None, f"no measured cost for {model} (give --results DIR of a run of it)")
    c = {**c, **c.get("benches", {}).get(grid.bench, {})}  # a bench's own measured costs, where recorded
    score = c["score_s"]
    unknown = [m for m in [*pruned, "full"] if m not in score]
    if unknown:
        return Estimate(grid, model, counts, None, f"no scoring cost for {', '.join(unknown)} on {model}")
    per_context = (
        c["prefill_s"]
        + sum(score[m] for m in [*pruned, "full"])
        + c.get("rest_s_per_context", 0.0)
        + children * c["fork_s_per_child"]
        + children * grid.questions * c["answer_s_per_child_question"]
    )
    return Estimate(grid, model, counts, contexts * per_context, c.get("source", ""))


def _cost_estimate(grid: Grid, model: str, costs: dict) -> Estimate:
    counts = (
        f"{len(grid.methods)} methods x lengths {', '.join(map(str, grid.lengths))}, {grid.repeats} rounds + warm-up"
    )
    c = costs.get("cost", {}).get(model)
    if c is None:
        return Estimate(grid, model, counts, None, f"no measured cost for {model}")
    total = 0.0
    for n in grid.lengths:
        prefill = c["prefill_s"].get(str(n))
        if prefill is None:
            return Estimate(grid, model, counts, None, f"no measured prefill at {n} tokens on {model}")
        scoring = 0.0
        for m in grid.methods:
            known = c["score_s"].get(m, {}).get(str(n))
            scoring += known if known is not None else c["other_score_share_of_prefill"] * prefill
        total += (grid.repeats + 1) * (prefill + scoring)
    return Estimate(grid, model, counts, total, c.get("source", ""))


def _labels_estimate(grid: Grid, model: str, costs: dict) -> Estimate:
    if grid.docs_per_kind is None:
        return Estimate(grid, model, "every document of --corpus", None, "documents of --corpus not counted here")
    docs = grid.docs_per_kind * _KINDS_PER_CORPUS
    rate = costs.get("labels", {}).get("s_per_doc_token")
    counts = f"{docs} documents of <= {grid.max_doc_tokens} tokens"
    if rate is None:
        return Estimate(grid, model, counts, None, "no measured labelling cost")
    return Estimate(grid, model, counts, docs * grid.max_doc_tokens * rate, costs["labels"].get("source", ""))


def _eval_estimate(grid: Grid, model: str, costs: dict, docs: int | None = None) -> Estimate:
    key = "cells" if grid.kind == "cells" else "artifact" if grid.artifact else "loco"
    rate = costs.get("eval", {}).get(f"{key}_s_per_doc")
    counts = {"cells": "1 per-cell analysis", "artifact": "1 evaluation"}.get(
        key, "1 evaluation, one training per held-out corpus"
    )
    if docs is not None:
        counts += f" over {docs} documents"
    if rate is None or docs is None:
        why = "no measured evaluation cost" if rate is None else "documents of --corpus not counted here"
        return Estimate(grid, model, counts, None, why)
    return Estimate(grid, model, counts, rate * docs, costs["eval"].get("source", ""))


def estimate_grid(grid: Grid, model: str, costs: dict, docs: int | None = None) -> Estimate:
    """The estimate of ``grid`` on ``model`` from ``costs`` (see ``costs.json``); ``docs``: the documents of an eval
    grid's label set (None: not known)."""
    if grid.kind in ("eval", "cells"):
        return _eval_estimate(grid, model, costs, docs)
    if grid.kind == "calibrate":
        return Estimate(grid, model, "1 calibration from --corpus", None, "no measured calibration cost for hub models")
    return {"run": _run_estimate, "cost": _cost_estimate, "labels": _labels_estimate}[grid.kind](grid, model, costs)


def label_docs(p: Plan, label_set: str) -> int | None:
    """Documents of ``label_set`` in plan ``p`` (None: every document of --corpus, not counted)."""
    for g in p.grids:
        if g.kind == "labels" and g.label_set == label_set and g.docs_per_kind is not None:
            return g.docs_per_kind * _KINDS_PER_CORPUS
    return None


def costs_from_rows(df: Any) -> dict[str, dict]:
    """``{"run": {model: per-context costs}}`` from result rows (a DataFrame of the rows' fields): prefill
    seconds per context, each method's scoring seconds per context, fork seconds per child and answer seconds
    per (child, question), means over the rows' contexts."""
    out: dict[str, dict] = {}
    if df is None or len(df) == 0:
        return out
    ctx = ["model", "bench", "task", "item"] if "item" in df.columns else ["model", "bench", "task"]

    def costs(rows: Any) -> dict:
        contexts = rows.drop_duplicates(ctx)
        scored = rows.drop_duplicates([*ctx, "method"])
        children = rows.drop_duplicates([*ctx, "method", "allocation", "p"])
        score = scored.groupby("method", observed=True).score_s.mean()
        return {
            "prefill_s": float(contexts.prefill_s.mean()),
            "score_s": {str(m): float(s) for m, s in score.items() if not math.isnan(s)},
            "fork_s_per_child": float(children.fork_s.mean()) if "fork_s" in rows else 0.0,
            "answer_s_per_child_question": float(rows.answer_s.mean()) if "answer_s" in rows else 0.0,
            "source": f"timing columns of {len(rows)} result rows ({len(contexts)} contexts)",
        }

    for model, rows in df.groupby("model", observed=True):
        entry = costs(rows)
        entry["benches"] = {str(b): costs(r) for b, r in rows.groupby("bench", observed=True)}
        out[str(model)] = entry
    return {"run": out}


def format_minutes(seconds: float) -> str:
    """``"48 min"``, ``"2.5 h"``, ``"40 s"``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def format_dry_run(p: Plan, costs: dict) -> list[str]:
    """The dry run's lines: the artifacts in the paper's order (their grids, or the reason), then every grid on
    every model with counts and estimate, then the total."""
    lines = [
        f"kvbench paper --scale {p.scale}: models {', '.join(p.models)} "
        f"(compared with the paper's Qwen3.8-27B{' and Qwen3.8-Flash-Next' if len(p.models) > 1 else ''})",
        "",
    ]
    for pa in p.artifacts:
        art = pa.artifact
        lines.append(f"{art.title}: {art.caption}")
        if pa.reason:
            lines.append(f"    not reproduced at this scale: {pa.reason}")
        else:
            lines.append(f"    grids: {', '.join(g.name for g in pa.grids)}")
        if pa.partial:
            lines.append(f"    partly: {pa.partial}")
    lines += ["", "grids:"]
    total, unknown = 0.0, []
    for grid in p.grids:
        lines.append(f"  {grid.name}: {grid.describe()}")
        for model in p.models_of(grid):
            docs = label_docs(p, grid.label_set) if grid.kind in ("eval", "cells") else None
            est = estimate_grid(grid, model, costs, docs)
            when = f"~{format_minutes(est.seconds)}" if est.seconds is not None else "time unknown"
            lines.append(f"    {model}: {est.counts}; {when}" + ("" if est.seconds is not None else f" ({est.why})"))
            if est.seconds is None:
                unknown.append(f"{grid.name} on {model}")
            else:
                total += est.seconds
    reasons: dict[str, list[str]] = {}
    for name, reason in p.blocked.items():
        reasons.setdefault(reason, []).append(name)
    for reason, names in reasons.items():
        lines.append(f"  not run: {', '.join(names)}: {reason}")
    lines.append("")
    if total and not unknown:
        lines.append(
            f"estimated {format_minutes(total)} in all (measured per-context costs; this machine's "
            "timings move by about 20 %)"
        )
    elif total:
        lines.append(
            f"estimated {format_minutes(total)} for the grids with a known cost; no known cost for "
            f"{len(unknown)}: {', '.join(unknown)}"
        )
    else:
        lines.append(f"no estimate: no measured cost for any grid ({len(unknown)} grid runs counted above)")
    return lines
