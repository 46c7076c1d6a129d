"""The ``cells`` stage of ``kvbench paper``: per-cell analyses of a label set that ``kvbench gatesight eval`` does
not compute (paper §3.2-3.3, Appendix C), written to ``DIR/gatesight/<model>/cells-<set>.json``:

* Figure 6: the Spearman ρ of every (GDN layer, value head) cell's effective write ``β‖v‖`` with U, per attention
  layer (averaged over its KV heads, then over documents);
* Figure 7: the ρ of each GDN layer's head-mean effective write with U, per attention layer, and the GDN layer
  (among those preceding the attention layer) where it is highest;
* Table 5's oracle row: for each attention layer and KV head the window cell with the highest mean overlap@10 %
  over the documents (an in-sample ceiling for one-cell rules), evaluated with every metric of Table 5;
* Figure 2c: the top / bottom decile lift of the slow-head ``β‖v‖`` (and of the window-mean ``β‖v‖``): the
  probability that an entry in the signal's highest (lowest) decile is in U's highest (lowest) decile, over
  chance.

The metrics are :mod:`.evaluate`'s (average-rank Spearman, overlap and coverage with ``k = max(4, ⌊k% m⌋)``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from kvbench.atomic import write_atomic
from kvbench.methods.gatesight.paper.artifacts import Grid, grid_paths

from ..evaluate import EvalConfig, average_ranks, doc_metrics, k_for, mean_of, slow_heads, top_k, untrained_predictors
from ..features import window_ordinals
from ..labels import LabelSet, load_labels

__all__ = ["DECILE_SIGNALS", "ORACLE", "cell_analysis", "cells_grid", "decile_lift", "rank_corr"]

ORACLE = "best single GDN head (oracle)"
#: the signals whose decile lift Figure 2c shows (slow heads) and its all-heads comparison (Figure 2b's pair)
DECILE_SIGNALS = ("slow-head β‖v‖", "β‖v‖, window mean")


def rank_corr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman ρ of every row of ``a`` ``[R, m]`` with every row of ``b`` ``[S, m]`` (average ranks): ``[R, S]``
    float64, 0 where a row is constant (as :func:`.evaluate.spearman`)."""

    def unit(x: torch.Tensor) -> torch.Tensor:
        r = torch.stack([average_ranks(row) for row in x.double()])
        r = r - r.mean(dim=1, keepdim=True)
        norm = r.norm(dim=1, keepdim=True)
        return torch.where(norm > 0, r / norm.clamp(min=1e-300), torch.zeros_like(r))

    return unit(a) @ unit(b).T


def _top_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    """``[R, m]`` bool: each row's ``k`` largest entries (stable order for ties)."""
    idx = torch.argsort(x, dim=1, descending=True, stable=True)[:, :k]
    return torch.zeros_like(x, dtype=torch.bool).scatter_(1, idx, True)


def decile_lift(signal: torch.Tensor, utility: torch.Tensor, gen: torch.Generator) -> tuple[float, float]:
    """(top, bottom) lift of one head: the share of ``signal``'s highest (lowest) 10 % of entries that are among
    ``utility``'s highest (lowest) 10 %, divided by the chance rate ``k / m``. Both 1-D over the body entries; ties
    in ``signal`` are broken at random (``gen``)."""
    m = utility.numel()
    k = max(1, math.floor(0.1 * m))
    order = torch.argsort(utility.double(), stable=True)
    lifts = []
    for sign, truth in ((1.0, order[-k:]), (-1.0, order[:k])):
        hit = torch.zeros(m, dtype=torch.bool)
        hit[truth] = True
        picked = top_k(sign * signal.double(), k, gen)
        lifts.append(float(hit[picked].sum()) / k / (k / m))
    return lifts[0], lifts[1]


def _effective_write(t: dict) -> torch.Tensor:
    """``β‖v‖`` ``[L_gdn, n, Hv]`` float64."""
    return t["beta"].double() * t["vnorm"].double()


def _first_pass(labels: LabelSet, windows: list[list[int]], preds: dict) -> dict:
    """Sums over documents: cell ρ ``[L, L_gdn, Hv]``, layer ρ ``[L, L_gdn]``, window-cell overlap@10
    ``[L, H_kv, L_gdn, Hv]`` and the decile lifts per signal."""
    sums: dict = {"cell_rho": 0.0, "layer_rho": 0.0, "ov10": 0.0, "lift": {n: [0.0, 0.0, 0] for n in preds}}
    for doc in labels.docs:
        t = doc.load()
        u = t["utility"].double()[:, :, doc.prot :]  # [L, H_kv, m]
        L, H, m = u.shape
        ew = _effective_write(t)[:, doc.prot :, :]  # [L_gdn, m, Hv]
        cells = ew.permute(0, 2, 1).reshape(-1, m)  # [L_gdn * Hv, m]
        sums["cell_rho"] = sums["cell_rho"] + rank_corr(u.reshape(L * H, m), cells).reshape(L, H, *ew.shape[::2]).mean(
            dim=1
        )
        sums["layer_rho"] = sums["layer_rho"] + rank_corr(u.reshape(L * H, m), ew.mean(dim=2)).reshape(L, H, -1).mean(
            dim=1
        )
        k = k_for(0.10, m)
        truth = _top_mask(u.reshape(L * H, m), k).double()
        picked = _top_mask(cells, k).double()
        sums["ov10"] = sums["ov10"] + (truth @ picked.T / k).reshape(L, H, ew.shape[0], ew.shape[2])
        gen = torch.Generator().manual_seed(0)
        for name, fn in preds.items():
            for f in range(L):
                sig = fn(t, f, doc)[0, doc.prot :]
                if windows[f] and bool((sig != sig[0]).any()):
                    for h in range(H):
                        top, bottom = decile_lift(sig, u[f, h], gen)
                        acc = sums["lift"][name]
                        acc[0], acc[1], acc[2] = acc[0] + top, acc[1] + bottom, acc[2] + 1
    return sums


def _oracle(labels: LabelSet, choice: list[list[tuple[int, int]]]) -> dict:
    """Table 5's metrics of the chosen cells (``choice[f][h]`` = (GDN ordinal, value head)), as
    :func:`.evaluate.evaluate_labels` reports a predictor."""
    per_doc = []
    for doc in labels.docs:
        t = doc.load()
        ew = _effective_write(t)
        gen = torch.Generator().manual_seed(0)
        layers = []
        for f, heads in enumerate(choice):
            pred = torch.stack([ew[j, :, v] for j, v in heads])  # [H_kv, n]
            layers.append(doc_metrics(pred.float(), t["utility"][f], doc.prot, gen))
        per_doc.append(layers)
    per_layer = [mean_of([layers[f] for layers in per_doc]) for f in range(len(choice))]
    return {"layer_mean": mean_of(per_layer), "per_layer": per_layer}


def cell_analysis(labels: LabelSet, window: int = 6, slow_threshold: float = 1000.0) -> dict:
    """Figures 6 and 7, Table 5's oracle row and Figure 2c's decile lifts of one label set (see the module
    docstring); ``window``: GDN layers per attention layer (the estimator's), ``slow_threshold``: tokens."""
    man = labels.manifest
    windows = window_ordinals(man["attn_layer_ids"], man["gdn_layer_ids"], window)
    preceding = window_ordinals(man["attn_layer_ids"], man["gdn_layer_ids"], len(man["gdn_layer_ids"]))
    slow, _ = slow_heads(labels.docs, slow_threshold)
    untrained = untrained_predictors(windows, slow, EvalConfig().seed)
    preds = {name: untrained[name] for name in DECILE_SIGNALS if name in untrained}
    if not bool(slow.any()):
        preds.pop(DECILE_SIGNALS[0], None)  # no slow head: the slow-head signal is a constant
    sums = _first_pass(labels, windows, preds)
    n = len(labels.docs)
    cell_rho, layer_rho, ov10 = sums["cell_rho"] / n, sums["layer_rho"] / n, sums["ov10"] / n
    choice = []
    for f, w in enumerate(windows):
        heads = []
        for h in range(ov10.shape[1]):
            if not w:
                heads.append((0, 0))
                continue
            sub = ov10[f, h, w]  # [len(w), Hv]
            best = int(torch.argmax(sub))
            heads.append((w[best // sub.shape[1]], best % sub.shape[1]))
        choice.append(heads)
    best_layer = [max(p, key=lambda j: float(layer_rho[f, j])) if p else None for f, p in enumerate(preceding)]
    lifts = {name: {"top": a / c, "bottom": b / c} for name, (a, b, c) in sums["lift"].items() if c}
    return {
        "attn_layer_ids": list(man["attn_layer_ids"]),
        "gdn_layer_ids": list(man["gdn_layer_ids"]),
        "windows": windows,
        "n_documents": n,
        "slow_heads": int(slow.sum()),
        "cell_rho": cell_rho.tolist(),
        "layer_rho": layer_rho.tolist(),
        "best_layer": best_layer,
        "oracle": {**_oracle(labels, choice), "cells": [[list(c) for c in heads] for heads in choice]},
        "decile_lift": lifts,
    }


def cells_grid(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
    """Write ``grid``'s cell analysis of ``model``'s label set (its ``labels`` grid), unless it exists."""
    from dataclasses import replace

    path = grid_paths(out, grid, model)
    if path.exists():
        return
    labels = load_labels(grid_paths(out, replace(grid, kind="labels"), model))
    task = bar.add_task(f"{grid.name} on {model}", total=None)
    result = cell_analysis(labels, grid.window)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(result, indent=1))
    bar.update(task, total=1, completed=1)
