"""Running a plan's grids (torch): each grid on each of its models, one stage at a time with a rich progress
bar, every output under one directory so that an interrupted ``kvbench paper`` resumes where it stopped:

* run grids -> ``DIR/results`` (one results store, :func:`kvbench.runner.run`; finished rows are skipped);
* the cost grid -> ``DIR/cost/<model>.json`` (:func:`kvbench.cost.measure_cost`; skipped when present);
* label grids -> ``DIR/gatesight/<model>/labels-<set>`` and ``dynamics-<set>.json`` (Figure 1's half-life
  statistics, :func:`half_life_stats`), eval grids -> ``DIR/gatesight/<model>/<grid>.json``: GateSight's own label
  and eval code, run by the stages :mod:`kvbench.methods.gatesight.paper` registers (:func:`register_stage`).
"""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path
from typing import Callable, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbench.errors import KvbenchError
from kvbench.paper.artifacts import Grid, Plan

__all__ = ["STAGES", "grid_paths", "half_life_stats", "register_stage", "run_plan"]

JACCARD_THRESHOLDS = (300, 1000, 4000)


def _safe(name: str) -> str:
    return name.replace("/", "__")


def grid_paths(out: Path, grid: Grid, model: str) -> Path:
    """Where a grid's output for ``model`` lives under ``out``."""
    if grid.kind == "run":
        return out / "results"
    if grid.kind == "cost":
        return out / "cost" / f"{_safe(model)}.json"
    if grid.kind == "labels":
        return out / "gatesight" / _safe(model) / f"labels-{grid.label_set}"
    return out / "gatesight" / _safe(model) / f"{grid.name}.json"


def _run_grid(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
    from kvbench.runner import RunConfig, run

    config = RunConfig(
        methods=list(grid.methods),
        bench=grid.bench,
        ps=list(grid.ps),
        out=grid_paths(out, grid, model),
        tasks=list(grid.tasks),
        allocations=list(grid.allocations) if grid.allocations else None,
        model=model,
        engine=opts.get("engine", "torch"),
        limit=grid.limit,
        device=opts.get("device", "cpu"),
        dtype=opts.get("dtype"),
        threads=opts.get("threads"),
        reference=True,
    )
    task = bar.add_task(f"{grid.name} on {model}", total=None)

    def progress(summary, total: int) -> None:
        bar.update(task, total=total, completed=summary.contexts)

    run(config, console, on_progress=progress)
    bar.update(task, completed=bar.tasks[task].total or 0)


def _cost_grid(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
    path = grid_paths(out, grid, model)
    if path.exists():
        done = json.loads(path.read_text())
        have = {(r["method"], r["length"]) for r in done.get("rows", [])}
        if all((m, n) in have for m in grid.methods for n in grid.lengths):
            return
    import torch

    from kvbench.cost import measure_cost, save_cost
    from kvbench.engines.torch_engine import TorchEngine
    from kvbench.models import load_model

    lm = load_model(model, device=opts.get("device", "cpu"), dtype=opts.get("dtype"))
    engine = TorchEngine(lm.model, lm.tokenizer)
    lengths = [n for n in grid.lengths if n <= engine.max_context]
    task = bar.add_task(f"cost on {model}", total=len(lengths))
    rows = []
    for n in lengths:
        rows += measure_cost(engine, list(grid.methods), [n], grid.repeats)
        bar.advance(task)
    meta = {
        "model": lm.name,
        "fingerprint": lm.fingerprint,
        "repeats": grid.repeats,
        "threads": torch.get_num_threads(),
        "skipped_lengths": [n for n in grid.lengths if n not in lengths],
    }
    save_cost(rows, path, meta)


#: grid kind -> the function that runs it, ``fn(grid, model, out, opts, bar, console)``. ``labels`` and ``eval``
#: (GateSight's label / eval code) are registered by the method's side, :mod:`kvbench.methods.gatesight.paper`, which
#: the ``kvbench paper`` command imports (the core names no method).
STAGES: dict[str, Callable] = {"run": _run_grid, "cost": _cost_grid}


def register_stage(kind: str, fn: Callable) -> None:
    """Run grids of ``kind`` with ``fn(grid, model, out, opts, bar, console)``."""
    STAGES[kind] = fn


def run_plan(p: Plan, out: Path, console: Console, **opts) -> list[tuple[str, str, float]]:
    """Run every grid of ``p`` on its models into ``out``; returns (grid, model, seconds) per stage. ``opts``:
    engine, device, dtype, threads, corpus (a label corpus directory instead of the generated one)."""
    timings = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    stages = [(g, m) for g in p.grids for m in p.models_of(g)]
    with Progress(*columns, console=console, transient=False) as bar:
        overall = bar.add_task("kvbench paper: stages", total=len(stages))
        for grid, model in stages:
            start = time.perf_counter()
            if grid.kind not in STAGES:
                raise KvbenchError(
                    f"no stage runs {grid.kind} grids ({grid.name}); run them through `kvbench paper`, which "
                    "registers them"
                )
            STAGES[grid.kind](grid, model, out, opts, bar, bar.console)
            timings.append((grid.name, model, time.perf_counter() - start))
            bar.advance(overall)
    return timings


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
