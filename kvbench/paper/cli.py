"""``kvbench paper``: the command's function, mounted by :mod:`kvbench.cli` (imports nothing heavy until run, so
``kvbench --help`` stays torch-free)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from kvbench import options
from kvbench.errors import KvbenchError

__all__ = ["paper"]


def _split(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def _frame(dirs: list[Path]):
    from kvbench.report.data import load, usable

    present = [d for d in dirs if d.is_dir()]
    if not present:
        return None
    df, _, _ = load(present)
    return usable(df) if not df.empty else None


def _timings(dirs: list[Path]):
    """The rows' identity and timing fields of ``dirs`` as a DataFrame (None: no rows)."""
    import pandas as pd

    from kvbench.results.read import read_results

    cols = ["model", "bench", "task", "item", "method", "allocation", "p", "prefill_s", "score_s", "fork_s", "answer_s"]
    rows = read_results(dirs).rows
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in rows]) if rows else None


def paper(
    *,
    scale: str = typer.Option(
        "tiny",
        "--scale",
        metavar="[tiny|paper]",
        help="tiny: both shipped models, offline, small grids; paper: the paper's grid for --model.",
    ),
    model: Optional[str] = typer.Option(
        None,
        "--model",
        help="With --scale paper: one or two hub ids or local directories (first: the paper's "
        "Qwen3.8-27B role, second: Qwen3.8-Flash-Next).",
    ),
    out: Path = typer.Option(
        Path("paper"),
        "--out",
        "-o",
        help="Directory: results/, cost/, gatesight/, figures/, paper.md, index.html; a rerun resumes into it.",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the grid of every artifact and its estimated time; load no model, write nothing.",
    ),
    results: Optional[str] = typer.Option(
        None,
        "--results",
        help="With --dry-run: results directories whose rows' "
        "timing columns replace the recorded per-context costs of their models.",
    ),
    render_only: bool = typer.Option(
        False, "--render-only", help="Run nothing: render the page from what --out holds."
    ),
    corpus: Optional[Path] = typer.Option(
        None,
        "--corpus",
        help="GateSight label corpus (one subdirectory per "
        "subset); --scale paper needs it for Tables 1/5/6/7 and Figures 1/2/8.",
    ),
    engine: str = options.ENGINE,
    device: str = options.DEVICE,
    dtype: Optional[str] = options.DTYPE,
    threads: Optional[int] = options.THREADS,
    limit: Optional[int] = typer.Option(
        None, "--limit", "-n", help="A reduced grid: at most N items per task and N label documents per kind."
    ),
    lengths: Optional[str] = typer.Option(
        None,
        "--lengths",
        help="Context lengths of the cost grid, comma separated (default: 4096,16384 tiny; 4K to 256K paper).",
    ),
    repeats: Optional[int] = typer.Option(None, "--repeats", help="Measured rounds of the cost grid (default 3)."),
    fractions: Optional[str] = typer.Option(
        None,
        "--p",
        help="Kept fractions of the run grids, comma separated (default: the paper's nine, 0.9 to 0.1); fewer "
        "give a reduced run whose nine-fraction means stay empty.",
    ),
) -> None:
    """Every table and figure of the GateSight paper: run each one's grid, render paper.md and index.html with the
    paper's numbers beside the measured ones and a verdict per finding (docs/paper.md)."""
    from kvbench.paper.artifacts import plan, shrink
    from kvbench.paper.estimate import costs_from_rows, format_dry_run, load_costs

    console = Console(stderr=True)
    if corpus is not None and not corpus.is_dir():
        raise KvbenchError(f"--corpus {corpus} is not a directory; give one subdirectory per corpus of documents")
    try:
        cost_lengths = tuple(int(x) for x in _split(lengths)) if lengths else None
    except ValueError:
        raise KvbenchError(f"--lengths {lengths!r}: give comma-separated integers, e.g. 4096,16384") from None
    try:
        ps = tuple(float(x) for x in _split(fractions)) if fractions else None
    except ValueError:
        raise KvbenchError(f"--p {fractions!r}: give comma-separated fractions, e.g. 0.7,0.1") from None
    p = shrink(plan(scale, _split(model) or None, corpus=corpus is not None), limit, cost_lengths, repeats, ps)
    if dry_run:
        costs = load_costs()
        if results:
            rows = _timings([Path(d) for d in _split(results)])
            if rows is None:
                raise KvbenchError(f"--results {results}: no result rows there; run kvbench paper or kvbench run first")
            costs["run"].update(costs_from_rows(rows).get("run", {}))
        Console().print("\n".join(format_dry_run(p, costs)), markup=False, highlight=False, soft_wrap=True)
        return
    if results:
        raise KvbenchError("--results applies to --dry-run (a real run keeps its rows in --out/results)")
    timings = []
    if not render_only:
        from kvbench.paper.stages import run_plan

        if out.exists() and not out.is_dir():
            raise KvbenchError(f"--out {out} is a file; give a directory")
        out.mkdir(parents=True, exist_ok=True)
        timings = run_plan(p, out, console, engine=engine, device=device, dtype=dtype, threads=threads, corpus=corpus)
    elif not out.is_dir():
        raise KvbenchError(f"--out {out} does not exist; run kvbench paper --out {out} first")
    index = render(p, out, timings)
    console.print(f"page written: {index} (and {out / 'paper.md'})", markup=False, soft_wrap=True)


def render(p, out: Path, timings: list | None = None) -> Path:
    """Measure what ``out`` holds for plan ``p``, render the page, write ``verdicts.json``; the HTML path."""
    from kvbench.atomic import write_atomic
    from kvbench.paper.measure import measure_all
    from kvbench.paper.numbers import load_numbers
    from kvbench.paper.page import build_page, write_page

    df = _frame([out / "results"])
    measured, raw = measure_all(out, p, df)
    blocks, verdicts = build_page(p, load_numbers(), measured, raw, df, out, timings)
    index = write_page(blocks, out)
    summary = [{"id": v.finding["id"], "status": v.status, "deciding": v.deciding, "note": v.note} for v in verdicts]
    write_atomic(
        out / "verdicts.json",
        json.dumps(
            {"scale": p.scale, "models": list(p.models), "verdicts": summary, "measured": measured},
            indent=1,
            ensure_ascii=False,
        ),
    )
    return index
