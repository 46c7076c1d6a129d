"""The paired evidence behind a verdict: the units two measured quantities share, and the report's paired bootstrap
over them (:func:`kvbench.report.tables.paired_bootstrap`, the one implementation; nothing is recomputed here).

* Accuracy (a run grid's task-averaged score at one p, or over the nine): the two quantities' rows pair on (task,
  context, question, sub-task, p); a resample draws contexts with replacement, the same context index in every task,
  so each task keeps its count of contexts. The interval's point is the mean over the (task, sub-task, p) cells of
  the paired differences (the measured difference when no task has sub-tasks).
* Predictor metrics of a ``kvbench gatesight eval`` (layer means): the two predictors pair on the held-out corpora
  (``per_corpus``); a resample draws corpora.
* Anything else (costs, Figure 1's statistics, per-cell values, per-layer metrics): no resampling unit is recorded,
  so a comparison there is a point comparison, and says so.

A comparator is *at the floor* when every row behind it scores 0: a win over it is "floor: not evidence".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvbench.methods.gatesight.paper.artifacts import ALL_P, Plan, model_roles
from kvbench.methods.gatesight.paper.numbers import spec_key

__all__ = ["LEVEL", "RESAMPLES", "Evidence", "Interval", "bootstrap_pairs"]

#: the verdicts' interval: level, resamples and seed of the paired bootstrap
LEVEL = 0.95
RESAMPLES = 4000
SEED = 0


@dataclass(frozen=True)
class Interval:
    """A paired difference ``diff`` (first minus second) with its bootstrap interval [``lo``, ``hi``] at ``level``;
    ``units`` resampled (contexts or corpora, ``unit`` names which), ``pairs`` paired observations."""

    diff: float
    lo: float
    hi: float
    units: int
    pairs: int
    unit: str
    level: float = LEVEL

    @property
    def width(self) -> float:
        return self.hi - self.lo

    def shifted(self, offset: float) -> Interval:
        """This interval plus ``offset`` (a comparison against ``A − B + margin``)."""
        return Interval(self.diff + offset, self.lo + offset, self.hi + offset, self.units, self.pairs, self.unit)


def bootstrap_pairs(pairs: Any, unit: str, resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL):
    """The paired bootstrap of ``pairs`` (a DataFrame: ``unit``, ``cell``, ``obs``, ``a``, ``b``; one row per paired
    observation) through :func:`kvbench.report.tables.paired_bootstrap`: ``a − b`` averaged within each cell, the
    cells averaged, units resampled with replacement. None when there is no pair."""
    import pandas as pd

    from kvbench.report.data import SETTING
    from kvbench.report.tables import paired_bootstrap

    if pairs is None or len(pairs) == 0:
        return None
    n = len(pairs)
    side = {
        **{c: ["-"] * n for c in SETTING},
        "task": ["pairs"] * n,
        "item": pairs["unit"].astype(str).to_list(),
        "question": pairs["obs"].astype(str).to_list(),
        "sub": pairs["cell"].astype(str).to_list(),
        "p": [0.0] * n,
        "query_aware": [False] * n,
        "allocation": ["-"] * n,
        "default_allocation": [""] * n,
    }
    frame = pd.concat(
        [
            pd.DataFrame({**side, "method": "a", "label": "a", "score": pairs["a"].to_numpy(float)}),
            pd.DataFrame({**side, "method": "b", "label": "b", "score": pairs["b"].to_numpy(float)}),
        ],
        ignore_index=True,
    )
    res = paired_bootstrap(frame, "b", resamples, seed, level)
    if res.empty:
        return None
    r = res.iloc[0]
    return Interval(float(r["diff"]), float(r["lo"]), float(r["hi"]), int(r["n_contexts"]), int(r["n_pairs"]), unit)


def _pct(metric: str, value: float) -> float:
    return value if metric == "rho" else 100.0 * value


class Evidence:
    """The units behind the measured values of one ``kvbench paper`` directory: the results frame ``df`` (usable
    rows; None: none) and the raw per-grid inputs of :func:`~.measure.measure_all` (``raw["eval"]``)."""

    def __init__(self, p: Plan, df: Any, raw: dict | None = None, resamples: int = RESAMPLES, seed: int = SEED):
        self.plan, self.df, self.resamples, self.seed = p, df, resamples, seed
        self.roles = model_roles(p.models)
        self.grids = {g.name: g for g in p.grids}
        self.evals: dict[tuple, dict] = {}
        from kvbench.methods.gatesight.paper.measure import eval_set

        for (model, grid_name), data in (raw or {}).get("eval", {}).items():
            grid = self.grids.get(grid_name)
            role = next((r for r, m in self.roles.items() if m == model), None)
            if grid is not None and role is not None:
                self.evals[(role, eval_set(grid), grid.window)] = data
        self._rows: dict[str, Any] = {}

    # -- accuracy ------------------------------------------------------------------------------------------
    def rows(self, spec: dict) -> Any:
        """The rows an accuracy spec averages (columns task, item, question, sub, p, score); None: none."""
        key = spec_key(spec)
        if key in self._rows:
            return self._rows[key]
        out = None
        grid = self.grids.get(spec.get("grid", ""))
        model = self.roles.get(spec.get("model", ""))
        if spec.get("kind") == "accuracy" and grid is not None and model and self.df is not None and len(self.df):
            from kvbench.methods.gatesight.paper.measure import accuracy_rows

            rows = accuracy_rows(self.df, grid, model)
            rows = rows[rows.method.astype(str) == spec["method"]]
            if "allocation" in spec:
                rows = rows[rows.allocation.astype(str) == spec["allocation"]]
            ps = rows.p.astype(float)
            if spec["p"] == "mean":
                rows = rows[ps.round(4).isin(ALL_P)]
                if rows.p.astype(float).round(4).nunique() < len(ALL_P):
                    rows = rows.iloc[:0]
            else:
                rows = rows[(ps - float(spec["p"])).abs() < 1e-6]
            if len(rows):
                out = rows[["task", "item", "question", "sub", "p", "score"]].astype(
                    {"task": str, "item": str, "question": str, "sub": str, "p": float, "score": float}
                )
        self._rows[key] = out
        return out

    def at_floor(self, spec: dict) -> bool:
        """Every row behind ``spec`` scores 0 (an accuracy at the floor); False where no row is known."""
        rows = self.rows(spec) if spec.get("kind") == "accuracy" else None
        return rows is not None and bool((rows.score == 0).all())

    def units(self, spec: dict) -> str:
        """How many units a value averages, e.g. ``"10 contexts x 6 tasks"``; empty where unknown."""
        rows = self.rows(spec) if spec.get("kind") == "accuracy" else None
        if rows is not None:
            per_task = rows.groupby("task").item.nunique()
            return f"{int(per_task.max())} contexts x {len(per_task)} tasks"
        data = self._eval(spec)
        if data is not None:
            return f"{len(data.get('per_corpus', {}))} corpora"
        return ""

    def _eval(self, spec: dict) -> dict | None:
        if spec.get("kind") != "predictor" or "layer" in spec:
            return None
        data = self.evals.get((spec.get("model"), spec.get("set"), spec.get("window")))
        pred = (data or {}).get("predictors", {}).get(spec.get("predictor"))
        return pred if pred and pred.get("per_corpus") else None

    def against(self, spec: dict, bound: float) -> Interval | None:
        """The interval of ``spec − bound`` (a threshold the paper states) over the units ``spec`` averages: the
        same paired bootstrap with the threshold as the other side; None where the units are not recorded."""
        import pandas as pd

        rows = self.rows(spec) if spec.get("kind") == "accuracy" else None
        if rows is not None:
            pairs = rows.assign(
                unit=rows.groupby("task").item.rank(method="dense").astype(int),
                cell=rows.task + "\x1f" + rows["sub"] + "\x1f" + rows.p.round(4).astype(str),
                obs=rows.task + "\x1f" + rows.item + "\x1f" + rows.question,
                a=rows.score,
                b=float(bound),
            )
            return bootstrap_pairs(pairs, "contexts", self.resamples, self.seed)
        pred = self._eval(spec)
        if pred is None:
            return None
        metric = spec["metric"]
        vals = [(c, m.get(metric)) for c, m in sorted(pred["per_corpus"].items()) if _finite(m.get(metric))]
        if not vals:
            return None
        pairs = pd.DataFrame(
            {
                "unit": [c for c, _ in vals],
                "cell": ["all"] * len(vals),
                "obs": ["0"] * len(vals),
                "a": [_pct(metric, x) for _, x in vals],
                "b": [float(bound)] * len(vals),
            }
        )
        return bootstrap_pairs(pairs, "corpora", self.resamples, self.seed)

    def paired(self, a: dict, b: dict) -> Interval | None:
        """The paired interval of ``a − b`` (two specs of one kind); None where the units are not recorded."""
        import pandas as pd

        if a.get("kind") == "accuracy" and b.get("kind") == "accuracy":
            ra, rb = self.rows(a), self.rows(b)
            if ra is None or rb is None:
                return None
            on = ["task", "item", "question", "sub", "p"]
            m = ra.merge(rb, on=on, suffixes=("_a", "_b"))
            if m.empty:
                return None
            # the same context index in every task: a resample keeps each task's count of contexts
            m["unit"] = m.groupby("task").item.rank(method="dense").astype(int)
            m["cell"] = m.task + "\x1f" + m["sub"] + "\x1f" + m.p.round(4).astype(str)
            m["obs"] = m.task + "\x1f" + m.item + "\x1f" + m.question
            pairs = m.rename(columns={"score_a": "a", "score_b": "b"})
            return bootstrap_pairs(pairs, "contexts", self.resamples, self.seed)
        pa, pb = self._eval(a), self._eval(b)
        if pa is None or pb is None or a.get("metric") != b.get("metric"):
            return None
        corpora = sorted(set(pa["per_corpus"]) & set(pb["per_corpus"]))
        metric = a["metric"]
        vals = [(c, pa["per_corpus"][c].get(metric), pb["per_corpus"][c].get(metric)) for c in corpora]
        vals = [(c, x, y) for c, x, y in vals if _finite(x) and _finite(y)]
        if not vals:
            return None
        pairs = pd.DataFrame(
            {
                "unit": [c for c, _, _ in vals],
                "cell": ["all"] * len(vals),
                "obs": ["0"] * len(vals),
                "a": [_pct(metric, x) for _, x, _ in vals],
                "b": [_pct(metric, y) for _, _, y in vals],
            }
        )
        return bootstrap_pairs(pairs, "corpora", self.resamples, self.seed)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not math.isnan(float(x))
