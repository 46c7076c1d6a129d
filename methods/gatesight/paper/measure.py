"""Measured values of a ``kvbench paper`` directory, keyed like the paper's numbers (:func:`spec_key`).

* accuracy: from the results frame (:func:`kvbench.report.data.load`, usable rows), per run grid and model:
  the mean over the grid's tasks of each task's score (:func:`kvbench.report.tables.task_scores` /
  :func:`~kvbench.report.tables.averaged`), per method (its default allocation unless the grid names
  allocations) and p, plus ``"mean"`` over the nine p when all nine are there;
* cost: ``score_s``, ``prefill_s`` and ``ratio`` (scoring / prefill) per method and length;
* predictor: every predictor's layer-mean metric (ρ as is, overlap / coverage in %), and per attention layer;
* dynamics: Figure 1's half-life statistics;
* cells: Table 5's oracle row, Figure 2c's decile lifts, Figures 6 and 7 per attention layer (:func:`cell_values`).

Model roles (``main`` / ``second``) come from :func:`kvbench.methods.gatesight.paper.artifacts.model_roles`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kvbench.methods.gatesight.paper.artifacts import ALL_P, Grid, Plan, grid_paths, model_roles
from kvbench.methods.gatesight.paper.numbers import spec_key

__all__ = [
    "accuracy_cells",
    "accuracy_rows",
    "accuracy_values",
    "cell_values",
    "cost_values",
    "eval_set",
    "measure_all",
    "predictor_values",
]


def _pct(metric: str, value: float) -> float:
    return value if metric == "rho" else 100.0 * value


def eval_set(grid: Grid) -> str:
    """The set name an eval grid's values carry: the trained estimator on the short labels is Table 6's ``1k``
    row; otherwise the label set."""
    return "1k" if grid.artifact and grid.label_set == "short" else grid.label_set


def accuracy_rows(df: Any, grid: Grid, model: str) -> Any:
    """The usable rows of ``grid`` on ``model``: its bench, tasks and methods (plus ``full``), its allocations (or
    each method's recorded default). The rows behind :func:`accuracy_cells` and the verdicts' paired intervals."""
    from kvbench.report import tables as T

    rows = df[
        (df.model.astype(str) == model)
        & (df.bench.astype(str) == grid.bench)
        & df.task.astype(str).isin(grid.tasks)
        & df.method.astype(str).isin([*grid.methods, "full"])
    ]
    if grid.allocations:
        keep = rows.method.astype(str).eq("full") | rows.allocation.astype(str).isin(grid.allocations)
    else:
        recorded = T.recorded_defaults(rows)
        allocs = rows.groupby(rows.method.astype(str)).allocation.agg(lambda a: sorted(set(a.astype(str))))
        defaults = {m: T.default_allocation(m, a, recorded) for m, a in allocs.items()}
        keep = rows.method.astype(str).eq("full") | (
            rows.allocation.astype(str) == rows.method.astype(str).map(lambda m: defaults.get(m) or "")
        )
    return rows[keep]


def accuracy_cells(df: Any, grid: Grid, model: str) -> Any:
    """Task scores (:func:`kvbench.report.tables.task_scores`) of :func:`accuracy_rows`."""
    from kvbench.report import tables as T

    if df is None or len(df) == 0:
        return T.task_scores(df.iloc[:0]) if df is not None else None
    return T.task_scores(accuracy_rows(df, grid, model))


def accuracy_values(df: Any, p: Plan) -> dict[str, float]:
    """Accuracy specs -> the mean over the grid's tasks (only cells every task of the grid has)."""
    out: dict[str, float] = {}
    roles = {name: role for role, name in model_roles(p.models).items()}
    for grid in p.grids:
        if grid.kind != "run":
            continue
        for model in p.models_of(grid):
            cells = accuracy_cells(df, grid, model)
            if cells is None or cells.empty:
                continue
            tasks = set(grid.tasks)
            for (method, alloc, pv), group in cells.groupby(["method", "allocation", "p"]):
                if set(group.task) != tasks:
                    continue  # a partial average is not the paper's
                spec = {"kind": "accuracy", "grid": grid.name, "model": roles[model], "method": method, "p": float(pv)}
                if grid.allocations and method != "full":
                    spec["allocation"] = alloc
                out[spec_key(spec)] = float(group.score.mean())
            _means(out, grid)
    return out


def _means(out: dict[str, float], grid: Grid) -> None:
    """Add ``p = "mean"`` for every (model, method, allocation) with all nine p."""
    groups: dict[str, list[float]] = {}
    for key, value in list(out.items()):
        spec = json.loads(key)
        if spec.get("grid") != grid.name or spec["p"] == "mean" or spec["method"] == "full":
            continue
        if round(spec["p"], 4) in ALL_P:
            base = spec_key({**spec, "p": "mean"})
            groups.setdefault(base, []).append(value)
    for base, values in groups.items():
        if len(values) == len(ALL_P):
            out[base] = sum(values) / len(values)


def cost_values(cost: dict, role: str) -> dict[str, float]:
    """A ``kvbench cost`` JSON (``{"rows": [...]}``) -> cost specs of ``role``."""
    out: dict[str, float] = {}
    for r in cost.get("rows", []):
        for stat in ("score_s", "prefill_s", "ratio"):
            spec = {"kind": "cost", "model": role, "method": r["method"], "length": int(r["length"]), "stat": stat}
            out[spec_key(spec)] = float(r[stat])
    return out


def predictor_values(result: dict, role: str, set_name: str, window: int) -> dict[str, float]:
    """A ``kvbench gatesight eval`` JSON -> predictor specs (layer means, and per layer with ``layer``). Where the
    evaluation found no slow head (``config.slow_heads`` all false) the slow-head rows are left out: they score a
    constant (chance level), so a finding about slow heads is not measurable rather than failed."""
    out: dict[str, float] = {}
    slow = result.get("config", {}).get("slow_heads")
    no_slow = slow is not None and not any(any(layer) for layer in slow)
    for name, pred in result.get("predictors", {}).items():
        if no_slow and "slow" in name:
            continue  # no slow head: these rows score a constant, they measure nothing
        base = {"kind": "predictor", "model": role, "set": set_name, "window": window, "predictor": name}
        for metric, value in pred.get("layer_mean", {}).items():
            if value == value:
                out[spec_key({**base, "metric": metric})] = _pct(metric, value)
        for i, layer in enumerate(pred.get("per_layer", [])):
            for metric, value in layer.items():
                if value == value:
                    out[spec_key({**base, "metric": metric, "layer": i})] = _pct(metric, value)
    return out


#: |ρ| above which a cell counts as correlated with U (Figure 6's share)
CELL_RHO = 0.1
ORACLE = "best single GDN head (oracle)"  # = kvbench.methods.gatesight.paper.cells.ORACLE (a test checks)


def cell_values(cells: dict, role: str, set_name: str, window: int) -> dict[str, float]:
    """A ``cells`` stage JSON -> measured values: Table 5's oracle row and Figure 2c's decile lifts as predictor
    specs; per attention layer (``kind: cells``, ``layer``) Figure 6's share of window cells with |ρ| > 0.1 (%)
    and largest cell ρ, Figure 7's best preceding GDN layer (its global index) and whether it lies outside the
    window (1 / 0); over all layers the fewest and most such shares and the largest cell ρ."""
    base = {"kind": "predictor", "model": role, "set": set_name, "window": window}
    out = predictor_values({"predictors": {ORACLE: cells["oracle"]}}, role, set_name, window)
    for name, lift in cells.get("decile_lift", {}).items():
        for side in ("top", "bottom"):
            out[spec_key({**base, "predictor": name, "metric": f"{side}_decile_lift"})] = float(lift[side])
    gdn_ids = cells["gdn_layer_ids"]
    shares, maxima = [], []
    for f, (rho, win) in enumerate(zip(cells["cell_rho"], cells["windows"], strict=True)):
        inside = [r for j in win for r in rho[j]]
        layer = {"kind": "cells", "model": role, "layer": f}
        if inside:
            shares.append(100.0 * sum(abs(r) > CELL_RHO for r in inside) / len(inside))
            maxima.append(max(inside))
            out[spec_key({**layer, "metric": "share_cells_rho_above_0.1"})] = shares[-1]
            out[spec_key({**layer, "metric": "max_cell_rho"})] = maxima[-1]
        best = cells["best_layer"][f]
        if best is not None:
            out[spec_key({**layer, "metric": "best_gdn_layer"})] = float(gdn_ids[best])
            out[spec_key({**layer, "metric": "best_layer_outside_window"})] = float(best not in win)
    if shares:
        whole = {"kind": "cells", "model": role}
        out[spec_key({**whole, "metric": "share_cells_rho_above_0.1_min"})] = min(shares)
        out[spec_key({**whole, "metric": "share_cells_rho_above_0.1_max"})] = max(shares)
        out[spec_key({**whole, "metric": "max_cell_rho"})] = max(maxima)
    return out


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def measure_all(out: Path, p: Plan, df: Any) -> tuple[dict[str, float], dict[str, dict]]:
    """Every measured value of ``out`` (a ``kvbench paper`` directory) for plan ``p`` and the results frame
    ``df`` (None: no rows), and the raw per-model inputs (``cost``, ``eval``, ``dynamics``, ``cells``) the page
    draws from."""
    measured = accuracy_values(df, p) if df is not None else {}
    raw: dict[str, dict] = {"cost": {}, "eval": {}, "dynamics": {}, "cells": {}}
    roles = {name: role for role, name in model_roles(p.models).items()}
    for grid in p.grids:
        for model in p.models_of(grid):
            role = roles[model]
            if grid.kind == "cost":
                data = _read_json(grid_paths(out, grid, model))
                if data:
                    raw["cost"][model] = data
                    measured.update(cost_values(data, role))
            elif grid.kind == "eval":
                data = _read_json(grid_paths(out, grid, model))
                if data:
                    raw["eval"][(model, grid.name)] = data
                    measured.update(predictor_values(data, role, eval_set(grid), grid.window))
            elif grid.kind == "cells":
                data = _read_json(grid_paths(out, grid, model))
                if data:
                    raw["cells"][model] = data
                    measured.update(cell_values(data, role, grid.label_set, grid.window))
            elif grid.kind == "labels":
                data = _read_json(grid_paths(out, grid, model).parent / f"dynamics-{grid.label_set}.json")
                if data:
                    raw["dynamics"][(model, grid.label_set)] = data
                    if grid.label_set == "short":
                        for metric, value in data.items():
                            if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
                                measured[spec_key({"kind": "dynamics", "model": role, "metric": metric})] = value
    return measured, raw
