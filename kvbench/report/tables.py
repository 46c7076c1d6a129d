"""The report's views as pure functions on the DataFrame of :mod:`kvbench.report.data` (scores 0–100).

Every function takes usable rows (``data.usable``: real compacted forks) and returns a long DataFrame keyed by
``SETTING`` (+ task / label / p as it applies); renderers pivot them. Conventions:

* a *task score* of a (setting, task, label, p) cell is the mean of its rows; a mixed SCBench task
  (``repoqa_and_kv``, ``summary_with_needles``: rows with a non-empty ``sub``) scores the mean of its
  sub-tasks' means, as the paper does;
* the *averaged* curve is the mean of the task scores over the setting's tasks (``n_tasks`` says how many
  entered; ``partial`` when some task lacks the cell);
* the no-prune score is method ``full`` (p = 1.0); query-aware rows (``query_aware``, e.g. ``oracle``) are a
  ceiling: they never enter rankings, best marks or confidence intervals.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvbench.methods import REFERENCE
from kvbench.report.data import SETTING

__all__ = [
    "GROUP",
    "across_groups",
    "across_models",
    "allocation_ablation",
    "averaged",
    "best_method",
    "ceiling_gap",
    "comparison_table",
    "cost_table",
    "default_allocation",
    "display_name",
    "kendall_tau_b",
    "main_table",
    "memory_view",
    "model_names",
    "paired_bootstrap",
    "parse_bytes",
    "rank_agreement",
    "ranked_labels",
    "recorded_defaults",
    "resample_weights",
    "revised_tasks",
    "scorer_sensitivity",
    "task_scores",
]

_OBS = {"observed": True, "sort": True}


def _aware(df: pd.DataFrame) -> set[str]:
    """Labels of query-aware rows."""
    return set(df.loc[df.query_aware, "label"].astype(str))


def task_scores(df: pd.DataFrame, score: str = "score") -> pd.DataFrame:
    """Per (SETTING, task, label, p): ``score`` (mixed tasks: mean of the sub-task means), ``n`` rows,
    ``method``, ``allocation``, ``query_aware``."""
    keys = [*SETTING, "task", "label", "p"]
    if df.empty:
        return pd.DataFrame(columns=[*keys, "score", "n", "method", "allocation", "query_aware"])
    sub = df.groupby([*keys, "sub"], **_OBS)[score].agg(["mean", "count"]).reset_index()
    sub = sub[sub["count"] > 0]
    out = sub.groupby(keys, **_OBS).agg(score=("mean", "mean"), n=("count", "sum")).reset_index()
    out = out[out.n > 0].reset_index(drop=True)
    labels = df.drop_duplicates("label")[["label", "method", "allocation"]]
    out = out.merge(labels, on="label", how="left")
    out["query_aware"] = out.label.astype(str).isin(_aware(df))
    for c in [*SETTING, "task", "label", "method", "allocation"]:
        out[c] = out[c].astype(str)
    return out


def averaged(cells: pd.DataFrame) -> pd.DataFrame:
    """Mean over tasks of ``task_scores`` per (SETTING, label, p): ``score``, ``n_tasks``, ``partial`` (fewer
    tasks than the setting has), ``n`` rows, ``method``, ``allocation``, ``query_aware``."""
    keys = [*SETTING, "label", "p"]
    if cells.empty:
        return pd.DataFrame(columns=[*keys, "score", "n_tasks", "n", "partial"])
    tasks = cells.groupby(SETTING).task.nunique().rename("setting_tasks")
    out = cells.groupby(keys, sort=True).agg(
        score=("score", "mean"), n_tasks=("task", "nunique"), n=("n", "sum"), method=("method", "first"),
        allocation=("allocation", "first"), query_aware=("query_aware", "first"),
    ).reset_index()  # fmt: skip
    out = out.merge(tasks, left_on=SETTING, right_index=True)
    out["partial"] = out.n_tasks < out.setting_tasks
    return out.drop(columns="setting_tasks")


def ranked_labels(cells: pd.DataFrame) -> set[str]:
    """Labels that compete in rankings and best marks: not ``full``, not query-aware."""
    return set(cells.loc[(cells.method != REFERENCE) & ~cells.query_aware.astype(bool), "label"])


def main_table(avg: pd.DataFrame) -> pd.DataFrame:
    """The main table of one setting: one row per label (``full`` first, query-aware last), a column per p
    (descending; ``p=1.0`` is the no-prune column), ``mean`` over the pruned p < 1 it has, and ``best``: the
    set of columns where this label is the best ranked label (ties all marked)."""
    if avg.empty:
        return pd.DataFrame(columns=["label", "mean", "best"])
    wide = avg.pivot_table(index="label", columns="p", values="score", aggfunc="first")
    wide = wide[sorted(wide.columns, reverse=True)]
    pruned = [p for p in wide.columns if p < 1.0]
    wide.columns = [f"p={p}" for p in wide.columns]
    wide["mean"] = wide[[f"p={p}" for p in pruned]].mean(axis=1) if pruned else math.nan
    ranked = ranked_labels(avg)
    best: dict[str, list[str]] = {lab: [] for lab in wide.index}
    for col in [c for c in wide.columns if c != "p=1.0"]:
        values = wide.loc[[lab for lab in wide.index if lab in ranked], col].dropna()
        if len(values):
            for lab in values.index[np.isclose(values, values.max(), rtol=0, atol=1e-9)]:
                best[lab].append(col)
    aware = set(avg.loc[avg.query_aware.astype(bool), "label"])
    order = sorted(wide.index, key=lambda lab: (lab in aware, not lab.startswith(REFERENCE + " "), lab))
    out = wide.loc[order].reset_index()
    out["best"] = [best[lab] for lab in out.label]
    return out


def ceiling_gap(avg: pd.DataFrame) -> pd.DataFrame:
    """Per (SETTING, ceiling, label, p): the query-aware ceiling's averaged score minus each ranked label's
    (``gap``, points), on the p both have."""
    ceil = avg[avg.query_aware.astype(bool)][[*SETTING, "p", "label", "score"]]
    ranked = avg[avg.label.isin(ranked_labels(avg))][[*SETTING, "p", "label", "score"]]
    if ceil.empty or ranked.empty:
        return pd.DataFrame(columns=[*SETTING, "ceiling", "label", "p", "gap"])
    m = ranked.merge(ceil, on=[*SETTING, "p"], suffixes=("", "_ceiling"))
    m["gap"] = m.score_ceiling - m.score
    return m.rename(columns={"label_ceiling": "ceiling"})[[*SETTING, "ceiling", "label", "p", "gap"]]


#: a setting less its model: the settings of one GROUP (the same engine, bench, prompt length and seed) that
#: differ only in their model (name or weights) are compared across models
GROUP = [c for c in SETTING if c not in ("model", "model_fingerprint")]
MODEL = ["model", "model_fingerprint"]


def across_models(cells: pd.DataFrame) -> pd.DataFrame:
    """Method scores side by side across the models of each GROUP that has two or more (else empty).

    Per (GROUP, model, model_fingerprint, label, p): ``score``, the mean over the ``n_tasks`` tasks that every
    model of the group has (so the models are averaged over the same tasks); ``complete`` when the label has all
    of them there; ``rank`` (1 = best, ties share their mean rank) among the complete ranked labels (not
    ``full``, not query-aware) of that model and p, NaN for the rest; ``method``, ``query_aware``.
    """
    cols = [*GROUP, *MODEL, "label", "p", "score", "n_tasks", "complete", "rank", "method", "query_aware"]
    if cells.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for _, g in cells.groupby(GROUP, sort=True):
        models = g[MODEL].drop_duplicates()
        if len(models) < 2:
            continue
        common = set.intersection(*(set(t.task) for _, t in g.groupby(MODEL, sort=True)))
        if not common:
            continue
        c = g[g.task.isin(common)]
        a = c.groupby([*GROUP, *MODEL, "label", "p"], sort=True).agg(
            score=("score", "mean"), tasks_here=("task", "nunique"), method=("method", "first"),
            query_aware=("query_aware", "first"),
        ).reset_index()  # fmt: skip
        a["complete"] = a.tasks_here == len(common)
        a["n_tasks"] = len(common)
        ranked = a.complete & a.label.isin(ranked_labels(a))
        a["rank"] = a.score.where(ranked).groupby([a[k] for k in [*MODEL, "p"]]).rank(ascending=False)
        out.append(a[cols])
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's rank correlation tau-b of two equally long score lists (ties in either allowed): the sum over
    pairs of ``sign(x_i - x_j) * sign(y_i - y_j)`` over ``sqrt((n0 - tx) (n0 - ty))``, ``n0`` the pairs, ``tx`` /
    ``ty`` the pairs tied in x / y. NaN when either list is constant or has fewer than two entries."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_b: {len(x)} and {len(y)} values")
    iu = np.triu_indices(len(x), k=1)
    sx, sy = np.sign(x[:, None] - x[None, :])[iu], np.sign(y[:, None] - y[None, :])[iu]
    denom = math.sqrt(np.count_nonzero(sx) * np.count_nonzero(sy))
    return float((sx * sy).sum() / denom) if denom else math.nan


def rank_agreement(across: pd.DataFrame) -> pd.DataFrame:
    """Per (GROUP, p, pair of models): Kendall's tau-b between the two models' scores of the ranked labels both
    rank (``tau``, NaN if fewer than two or either is constant), over ``n`` labels. Models are named
    ``model`` (``model@fingerprint[:8]`` where one name has two weights)."""
    cols = [*GROUP, "p", "model_a", "model_b", "tau", "n"]
    ranked = across[across["rank"].notna()] if len(across) else across
    if ranked.empty:
        return pd.DataFrame(columns=cols)
    names = model_names(across)
    out = []
    for key, g in ranked.groupby([*GROUP, "p"], sort=True):
        wide = g.pivot_table(index="label", columns=MODEL, values="score", aggfunc="first")
        models = list(wide.columns)
        for i, a in enumerate(models):
            for b in models[i + 1 :]:
                both = wide[[a, b]].dropna()
                tau = kendall_tau_b(both[a], both[b]) if len(both) >= 2 else math.nan
                out.append((*key, names[a], names[b], tau, len(both)))
    return pd.DataFrame(out, columns=cols)


def across_groups(cells: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame, pd.DataFrame]]:
    """``(GROUP key, across_models rows, rank_agreement rows)`` of every GROUP holding two or more models, in
    key order: what the report and the terminal tables show across models."""
    across = across_models(cells)
    agree = rank_agreement(across)
    by_key = {key: g for key, g in agree.groupby(GROUP, sort=True)} if len(agree) else {}
    empty = agree.iloc[0:0]
    return [(key, g, by_key.get(key, empty)) for key, g in across.groupby(GROUP, sort=True)]


def model_names(df: pd.DataFrame) -> dict[tuple[str, str], str]:
    """``(model, model_fingerprint) -> name`` shown: the model, ``model@fingerprint[:8]`` where a name has two
    or more weights."""
    pairs = sorted({(str(m), str(f)) for m, f in df[MODEL].itertuples(index=False)})
    clash = {m for m, _ in pairs if sum(1 for n, _ in pairs if n == m) > 1}
    return {(m, f): f"{m}@{f[:8]}" if m in clash else m for m, f in pairs}


@functools.lru_cache(maxsize=None)
def _declared_default(method: str) -> str | None:
    """The ``default_allocation`` the method's class declares; None for a method not installed here."""
    try:
        from kvbench.methods import method_class

        return method_class(method.split("[", 1)[0]).default_allocation  # METHOD[OPTION=VALUE]: a variant
    except Exception:  # a third-party method not installed where the report runs
        return None


def recorded_defaults(df: pd.DataFrame) -> dict[str, str]:
    """``{method: default allocation}`` as the rows record it (their method's class attribute when they ran);
    rows of a kvbench that did not record it give none."""
    if df.empty:
        return {}
    pairs = df.groupby(["method", "default_allocation"], observed=True, sort=False).size()  # on the category codes
    return {str(m): str(a) for (m, a), n in pairs.items() if n and str(a)}


def default_allocation(method: str, allocations: Sequence[str], recorded: dict[str, str] | None = None) -> str | None:
    """The method's own default allocation when it is among ``allocations``: as its rows record it
    (``recorded``, :func:`recorded_defaults`), else as its class declares it where the report runs; None when
    neither knows it or that allocation was not run (no other allocation is taken for it)."""
    default = (recorded or {}).get(method) or _declared_default(method)
    return default if default in allocations else None


def _reference_label(df: pd.DataFrame, reference: str) -> str | None:
    """The label of the reference method's rows: its default allocation, without method options if any; its
    only allocation when just one was run; None when it has none of these rows."""
    rows = df[df.method == reference]
    if rows.empty:
        return None
    allocs = sorted(set(rows.allocation.astype(str)))
    alloc = default_allocation(reference, allocs, recorded_defaults(rows))
    if alloc is None:
        if len(allocs) != 1:
            return None
        alloc = allocs[0]
    labels = sorted(set(rows.loc[rows.allocation == alloc, "label"].astype(str)), key=len)
    return labels[0]


def resample_weights(n_contexts: int, n_resamples: int, seed: Sequence[int]) -> np.ndarray:
    """``[n_resamples, n_contexts]`` counts: how often each context is drawn in each bootstrap resample
    (each row: ``n_contexts`` contexts drawn uniformly with replacement), from ``default_rng(seed)``."""
    rng = np.random.default_rng(list(seed))
    draws = rng.integers(0, n_contexts, size=(n_resamples, n_contexts))
    flat = (np.arange(n_resamples)[:, None] * n_contexts + draws).ravel()
    return np.bincount(flat, minlength=n_resamples * n_contexts).reshape(n_resamples, n_contexts).astype(np.float64)


def paired_bootstrap(
    df: pd.DataFrame, reference: str, n_resamples: int = 10_000, seed: int = 0, level: float = 0.95
) -> pd.DataFrame:
    """Paired bootstrap of each ranked label's task score minus the reference method's, per (SETTING, task, p).

    Pairs are rows of the same (item, question) at the same p; resampling draws contexts (items) with
    replacement, so the questions of a context move together; a mixed task's difference is the mean of its
    sub-tasks' mean differences in each resample. Returns ``diff`` (points, on all pairs), ``lo``/``hi`` (the
    ``level`` percentile interval), ``significant`` (the interval excludes 0), ``n_pairs``, ``n_contexts``,
    ``reference`` (its label). The resamples of a (setting, task) are seeded by ``seed`` and a CRC of its key,
    so a cell's interval does not depend on what else is in the report. Query-aware rows and ``full`` are left
    out; a setting without the reference method gets no rows.
    """
    cols = [*SETTING, "task", "label", "p", "diff", "lo", "hi", "significant", "n_pairs", "n_contexts", "reference"]
    d = df[~df.query_aware.astype(bool) & (df.method != REFERENCE)]
    out = []
    for key, g in d.groupby(SETTING, **_OBS):
        ref = _reference_label(g, reference)
        if ref is None:
            continue
        pair = ["task", "item", "question", "sub", "p"]
        r = g.loc[g.label == ref, [*pair, "score"]]
        o = g.loc[g.label != ref, [*pair, "label", "score"]]
        m = o.merge(r, on=pair, suffixes=("", "_ref"))
        if m.empty:
            continue
        m["diff"] = m.score - m.score_ref
        for task, t in m.groupby("task", **_OBS):
            out.append(_bootstrap_task(t, (*key, task), ref, n_resamples, seed, level))
    if not out:
        return pd.DataFrame(columns=cols)
    res = pd.concat(out, ignore_index=True)
    for c in [*SETTING, "task", "label"]:
        res[c] = res[c].astype(str)
    return res[cols]


def _bootstrap_task(t: pd.DataFrame, key: tuple, ref: str, n_resamples: int, seed: int, level: float) -> pd.DataFrame:
    """The vectorised bootstrap of one (setting, task): per-context sums and counts of the paired differences
    of each (label, p, sub) column, reweighted by the resample counts in one matrix product."""
    ctx_codes, ctx_names = pd.factorize(t["item"], sort=True)
    col_codes, cols = pd.MultiIndex.from_arrays([t.label, t.p, t["sub"]]).factorize(sort=True)
    n_ctx, n_col = len(ctx_names), len(cols)
    flat = ctx_codes.astype(np.int64) * n_col + col_codes
    sums = np.bincount(flat, weights=t["diff"].to_numpy(float), minlength=n_ctx * n_col).reshape(n_ctx, n_col)
    counts = np.bincount(flat, minlength=n_ctx * n_col).reshape(n_ctx, n_col).astype(np.float64)
    # column (label, p, sub) -> cell (label, p); a cell averages its sub-task columns
    cell_codes, cell_index = pd.MultiIndex.from_arrays([cols.get_level_values(0), cols.get_level_values(1)]).factorize()
    avg = np.zeros((n_col, len(cell_index)))
    n_sub = np.bincount(cell_codes)
    avg[np.arange(n_col), cell_codes] = 1.0 / n_sub[cell_codes]
    # the draws are seeded by the setting and task; a single-source bench's "None" source is left out, so
    # its intervals are those of the rows before ``source`` existed
    named = [str(v) for c, v in zip([*SETTING, "task"], key, strict=True) if not (c == "source" and str(v) == "None")]
    crc = zlib.crc32("\x1f".join(named).encode())
    w = resample_weights(n_ctx, n_resamples, (seed, crc))
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = ((w @ sums) / (w @ counts)) @ avg  # [B, cells]; NaN where a resample drew no pair of a sub-task
        point = (sums.sum(0) / counts.sum(0)) @ avg
    alpha = (1 - level) / 2 * 100
    # NaN only where some resample drew no pair of a sub-task; nanpercentile (slow) only then
    percentile = np.nanpercentile if np.isnan(boot).any() else np.percentile
    lo, hi = percentile(boot, [alpha, 100 - alpha], axis=0)
    pairs = np.bincount(cell_codes, weights=counts.sum(0))
    ctx_n = ((counts @ (avg > 0)) > 0).sum(0)
    res = pd.DataFrame(
        {"label": [c[0] for c in cell_index], "p": [c[1] for c in cell_index], "diff": point,
         "lo": lo, "hi": hi, "n_pairs": pairs.astype(int), "n_contexts": ctx_n}
    )  # fmt: skip
    res["significant"] = (res.lo > 0) | (res.hi < 0)
    res["reference"] = ref
    for name, value in zip([*SETTING, "task"], key, strict=True):
        res[name] = value
    return res


def revised_tasks(df: pd.DataFrame) -> set[str]:
    """Tasks whose scorer has a revision that is a different function (SCBench ``qa_chn``, ``choice_eng``, the
    kv half of ``repoqa_and_kv``), read from the rows' scorer names ``X`` / ``X_revised``."""
    from kvbench.scorers import get_scorer

    out = set()
    for task, scorer in df[["task", "scorer"]].drop_duplicates().itertuples(index=False):
        name = str(scorer).removesuffix("_revised")
        try:
            if get_scorer(name) is not get_scorer(name + "_revised"):
                out.add(str(task))
        except Exception:  # no such scorer pair registered: no revision
            continue
    return out


def _order(avg: pd.DataFrame) -> pd.Series:
    """Per (SETTING, p): the ranked labels, best first (ties broken by name), as a tuple."""
    r = avg[avg.label.isin(ranked_labels(avg))].sort_values(["score", "label"], ascending=[False, True])
    return r.groupby([*SETTING, "p"], sort=True).label.agg(tuple)


def scorer_sensitivity(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Official vs revised scorers: ``per_task`` (each revised task's official and revised score and their
    difference per label and p), ``means`` (the all-task mean under each, every task entering with its
    official score in the official column and its revised one, where it has one, in the other) and ``order``
    (per p: the ranking of the methods under each and whether it is the same). Empty frames when no task of
    the rows has a revised scorer."""
    tasks = revised_tasks(df)
    if not tasks:
        empty = pd.DataFrame()
        return {"per_task": empty, "means": empty, "order": empty}
    keys = [*SETTING, "task", "label", "p"]
    off, rev = task_scores(df, "score_official"), task_scores(df, "score_revised")
    per = off.merge(rev[[*keys, "score"]], on=keys, suffixes=("_official", "_revised"))
    per = per[per.task.isin(tasks)]
    per["delta"] = per.score_revised - per.score_official
    a_off, a_rev = averaged(off), averaged(rev)
    k2 = [*SETTING, "label", "p"]
    means = a_off.merge(a_rev[[*k2, "score"]], on=k2, suffixes=("_official", "_revised"))
    means["delta"] = means.score_revised - means.score_official
    o_off, o_rev = _order(a_off), _order(a_rev)
    order = pd.DataFrame({"order_official": o_off, "order_revised": o_rev}).reset_index()
    order["same"] = order.order_official == order.order_revised
    cols = [*keys, "score_official", "score_revised", "delta", "n"]
    return {"per_task": per[cols].reset_index(drop=True), "means": means[[*k2, "score_official", "score_revised",
            "delta", "n_tasks", "partial"]], "order": order}  # fmt: skip


def best_method(avg: pd.DataFrame) -> str | None:
    """The ranked method (not ``full``, not query-aware) with the highest mean of its averaged scores over the
    pruned kept fractions (p < 1) of every setting, allocation and option set it has (ties: the first name); None
    when no ranked method has a pruned cell. ``avg``: :func:`averaged` rows."""
    r = avg[avg.label.isin(ranked_labels(avg)) & (avg.p < 1.0)]
    if r.empty:
        return None
    means = r.groupby(r.method.astype(str), sort=True).score.mean()
    return str(means.index[np.isclose(means, means.max(), rtol=0, atol=1e-9)][0])


def display_name(method: str) -> str:
    """How the report writes ``method`` in prose: its class's name where that spells the method name in other
    letter cases (``KVzip`` for ``kvzip``), else the name itself (a method not installed where the report runs)."""
    try:
        from kvbench.methods import method_class

        name = method_class(method).__name__
    except Exception:  # not installed here, or not a plain method name (METHOD[OPTION=VALUE], METHOD@SHA)
        return method
    return name if name.lower() == method.lower() else method


def comparison_table(df: pd.DataFrame, avg: pd.DataFrame, method: str) -> pd.DataFrame:
    """Every ranked label against ``method`` per setting that has it: per p the averaged score and its difference
    to ``method``'s (``delta``, points; its label of the shortest name where it has several), plus each label's
    median scoring and prefill seconds per context and the median of their ratio, from the rows. ``method``'s own
    score is the column named ``method`` (``compared`` where that name is taken by another column)."""
    base = [*SETTING, "label", "p", "score", "delta", "score_s", "prefill_s", "score_over_prefill"]
    col = "compared" if method in {*base, *avg.columns, "ref_label", "ratio"} else method
    cols = [*SETTING, "label", "p", "score", col, "delta", "score_s", "prefill_s", "score_over_prefill"]
    ref = avg[avg.method == method]
    if ref.empty:
        return pd.DataFrame(columns=cols)
    ref_label = ref.groupby(SETTING).label.agg(lambda s: sorted(s, key=len)[0]).rename("ref_label")
    ranked = avg[avg.label.isin(ranked_labels(avg))].merge(ref_label, left_on=SETTING, right_index=True)
    refs = avg.rename(columns={"label": "ref_label", "score": col})[[*SETTING, "ref_label", "p", col]]
    m = ranked.merge(refs, on=[*SETTING, "ref_label", "p"], how="left")
    m["delta"] = m.score - m[col]
    per_ctx = df.groupby([*SETTING, "label", "task", "item"], **_OBS)[["score_s", "prefill_s"]].first().dropna()
    per_ctx["ratio"] = per_ctx.score_s / per_ctx.prefill_s
    timing = per_ctx.groupby([*SETTING, "label"], observed=True).median().reset_index()
    for c in [*SETTING, "label"]:
        timing[c] = timing[c].astype(str)
    m = m.merge(timing.rename(columns={"ratio": "score_over_prefill"}), on=[*SETTING, "label"], how="left")
    return m[cols]


def allocation_ablation(avg: pd.DataFrame, defaults: dict[str, str] | None = None) -> pd.DataFrame:
    """Methods run with more than one allocation: per (SETTING, method, allocation, p) the averaged score and
    its difference (points) to the same method's default allocation at that p (``delta``; 0 for the default).
    ``defaults``: the rows' recorded defaults (:func:`recorded_defaults`); a method whose default is unknown or
    was not run gets ``default`` ``""`` and NaN deltas (never another allocation as a stand-in)."""
    cols = [*SETTING, "method", "allocation", "default", "p", "score", "delta", "partial"]
    a = avg[~avg.query_aware.astype(bool) & (avg.method != REFERENCE)]  # a variant METHOD[OPTION=VALUE]: its own method
    out = []
    for (*_, method), g in a.groupby([*SETTING, "method"], sort=True):
        allocs = sorted(set(g.allocation))
        if len(allocs) < 2:
            continue
        default = default_allocation(method, allocs, defaults)
        if default is None:
            out.append(g.assign(default="", delta=math.nan))
            continue
        base = g[g.allocation == default].set_index("p").score
        g = g.assign(default=default, delta=g.score - g.p.map(base))
        out.append(g)
    if not out:
        return pd.DataFrame(columns=cols)
    return pd.concat(out, ignore_index=True)[cols]


def cost_table(cost: dict) -> pd.DataFrame:
    """``kvbench cost`` output (``{"meta", "rows": [{method, length, prefill_s, score_s, ratio}]}``) as a long
    table sorted by method and length; ``ratio`` recomputed as scoring / prefill seconds."""
    rows = pd.DataFrame(cost.get("rows", []), columns=["method", "length", "prefill_s", "score_s"])
    rows["ratio"] = rows.score_s / rows.prefill_s
    return rows.sort_values(["method", "length"]).reset_index(drop=True)


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
          "GIB": 2**30, "TIB": 2**40}  # fmt: skip


def parse_bytes(text: str) -> int:
    """``"141GB"`` -> 141·10⁹ bytes, ``"80GiB"`` -> 80·2³⁰, a plain number -> bytes. ValueError otherwise."""
    s = str(text).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num) :]
    if unit not in _UNITS or not num:
        raise ValueError(f"{text!r} is not a size like 141GB, 80GiB or 1e9")
    return int(float(num) * _UNITS[unit])


def memory_view(df: pd.DataFrame, shapes: dict[tuple[str, str], dict], gpu_bytes: int, serve_length: int):
    """KV bytes per session and concurrent sessions per accelerator, computed from the measured bytes.

    Per (SETTING, label, p): ``kept_ratio`` = mean measured ``stored_bytes / full_bytes`` of the rows;
    ``full_per_token`` = the model's attention K+V bytes per token, ``2 · n_attn_layers · n_kv_heads ·
    head_dim · dtype_bytes`` from its recorded ``model_shape`` (else the measured ``full_bytes / n_context``);
    ``session_bytes`` = ``kept_ratio · full_per_token · serve_length``; ``sessions`` = ``floor((gpu_bytes −
    weight_bytes) / session_bytes)`` (NaN when the model's weight bytes are not recorded). ``shapes`` maps
    (model, model_fingerprint) to the manifest's ``model_shape``. GDN recurrent states (a fixed size per session)
    are not counted.
    """
    d = df[df.full_bytes > 0]
    keys = [*SETTING, "label", "p"]
    cols = [*keys, "kept_ratio", "measured_per_token", "full_per_token", "session_bytes", "weight_bytes", "sessions"]
    if d.empty:
        return pd.DataFrame(columns=cols)
    d = d.assign(ratio=d.stored_bytes / d.full_bytes, per_token=d.full_bytes / d.n_context)
    out = d.groupby(keys, **_OBS).agg(kept_ratio=("ratio", "mean"), measured_per_token=("per_token", "mean"))
    out = out.dropna(subset=["kept_ratio"]).reset_index()
    for c in [*SETTING, "label"]:
        out[c] = out[c].astype(str)
    full, weights = [], []
    for model, fp, measured in out[["model", "model_fingerprint", "measured_per_token"]].itertuples(index=False):
        shape = shapes.get((model, fp)) or {}
        need = ("n_attn_layers", "n_kv_heads", "head_dim", "dtype_bytes")
        if all(k in shape for k in need):
            full.append(2.0 * math.prod(float(shape[k]) for k in need))
        else:
            full.append(measured)
        weights.append(float(shape.get("weight_bytes", math.nan)))
    out["full_per_token"] = full
    out["session_bytes"] = out.kept_ratio * out.full_per_token * serve_length
    out["weight_bytes"] = weights
    out["sessions"] = np.floor((gpu_bytes - out.weight_bytes) / out.session_bytes).clip(lower=0)
    return out[cols]
