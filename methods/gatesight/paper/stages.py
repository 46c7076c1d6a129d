"""Running a plan's grids (torch): each grid on each of its models, one stage at a time with a rich progress
bar, every output under one directory so that an interrupted ``kvbench paper`` resumes where it stopped:

* run grids -> ``DIR/results`` (one results store, :func:`kvbench.run.loop.run`; finished rows are skipped);
* the cost grid -> ``DIR/cost/<model>.json`` (:func:`kvbench.cost.measure_cost`; skipped when present);
* label grids -> ``DIR/gatesight/<model>/labels-<set>`` and ``dynamics-<set>.json`` (Figure 1's half-life
  statistics, :func:`~.halflife.half_life_stats`), eval grids -> ``DIR/gatesight/<model>/<grid>.json``, cells grids ->
  ``DIR/gatesight/<model>/cells-<set>.json``: GateSight's own label and eval code (:mod:`.gatesight_stages`,
  imported when a stage of its kind runs).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbench.errors import KvbenchError
from kvbench.methods.gatesight.paper.artifacts import Grid, Plan, grid_paths

__all__ = ["STAGES", "run_plan"]


def _run_grid(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
    from kvbench.run.loop import run
    from kvbench.run.plan import RunConfig

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
    engine = TorchEngine(lm.model, lm.tokenizer, fingerprint=lm.fingerprint)
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


def _gatesight(name: str) -> Callable:
    """The stage ``name`` of :mod:`.gatesight_stages` (GateSight's label / eval / cells code), imported on first
    use so that planning and rendering load no torch."""

    def stage(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
        from kvbench.methods.gatesight.paper import gatesight_stages

        getattr(gatesight_stages, name)(grid, model, out, opts, bar, console)

    return stage


#: grid kind -> the function that runs it, ``fn(grid, model, out, opts, bar, console)``
STAGES: dict[str, Callable] = {
    "run": _run_grid,
    "cost": _cost_grid,
    "labels": _gatesight("labels_stage"),
    "eval": _gatesight("eval_stage"),
    "cells": _gatesight("cells_stage"),
    "calibrate": _gatesight("calibrate_stage"),
}


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
                raise KvbenchError(f"no stage runs {grid.kind} grids ({grid.name}); give one of {', '.join(STAGES)}")
            STAGES[grid.kind](grid, model, out, opts, bar, bar.console)
            timings.append((grid.name, model, time.perf_counter() - start))
            bar.advance(overall)
    return timings
