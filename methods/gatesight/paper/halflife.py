"""Figure 1's statistics of GDN head half-lives (pure functions; no torch)."""

from __future__ import annotations

import itertools
import math
from typing import Sequence

__all__ = ["JACCARD_THRESHOLDS", "half_life_stats"]

JACCARD_THRESHOLDS = (300, 1000, 4000)


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    def ranks(x: Sequence[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else math.nan


def _quantile(xs: Sequence[float], q: float) -> float:
    xs = sorted(x for x in xs if not math.isnan(x))
    if not xs:
        return math.nan
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def half_life_stats(per_doc: list[list[float]], thresholds: Sequence[int] = JACCARD_THRESHOLDS) -> dict:
    """Figure 1's statistics from per-document head half-lives (tokens; one flat list of every GDN head per
    document, ``inf`` for a head that never decays): the median over heads of the per-head median
    (``median_half_life``), the Spearman ρ of the head ordering for every document pair (``pair_rho_p10/p50/p90``),
    and per threshold the median Jaccard of each document's slow set (half-life >= threshold) with the global one
    (median half-life >= threshold; NaN where both are empty)."""
    cap = 1e12  # inf ranks above every finite half-life
    docs = [[min(h, cap) for h in d] for d in per_doc]
    heads = len(docs[0]) if docs else 0
    median = [_quantile([d[i] for d in docs], 0.5) for i in range(heads)]
    pairs = [_spearman(a, b) for a, b in itertools.combinations(docs, 2)]
    out = {
        "documents": len(docs),
        "heads": heads,
        "median_half_life": _quantile(median, 0.5),
        "pair_rho_p10": _quantile(pairs, 0.1),
        "pair_rho_p50": _quantile(pairs, 0.5),
        "pair_rho_p90": _quantile(pairs, 0.9),
        "pairs": len(pairs),
        "head_median": median,
    }
    for t in thresholds:
        glob = {i for i, h in enumerate(median) if h >= t}
        jac = []
        for d in docs:
            mine = {i for i, h in enumerate(d) if h >= t}
            union = mine | glob
            jac.append(len(mine & glob) / len(union) if union else math.nan)
        out[f"jaccard_median@{t}"] = _quantile(jac, 0.5)
        out[f"slow_heads@{t}"] = len(glob)
    return out
