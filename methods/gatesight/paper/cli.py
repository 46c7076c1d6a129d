"""``kvbench paper``: the command (``app``, registered in :data:`kvbench.methods.BUILTIN_COMMANDS` as ``paper``); it
imports nothing heavy until run, so ``kvbench --help`` stays torch-free."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from kvbench.errors import KvbenchError

__all__ = ["app", "paper"]


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
        help="Render the page into --out from existing rows, computing nothing: a kvbench paper directory (its "
        "results/, cost/, gatesight/) or results directories, comma separated. With --dry-run: their rows' timing "
        "columns replace the recorded per-context costs of their models.",
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
    data_dir: Optional[Path] = typer.Option(
        None,
        "--data-dir",
        help="External bench data (ruler/, scbench/ from `kvbench data fetch`); --scale paper needs it for RULER's "
        "data tasks and SCBench's hub tasks; default $KVBENCH_DATA_DIR.",
    ),
    engine: str = typer.Option("torch", "--engine", metavar="[torch|vllm]", help="Engine of the run grids."),
    device: str = typer.Option("cpu", "--device", help="torch device (cuda for --scale paper)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Weights dtype (default: fp32 on CPU, bf16 on GPU)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads."),
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
    from kvbench.methods.gatesight.paper.artifacts import plan, shrink
    from kvbench.methods.gatesight.paper.estimate import costs_from_rows, format_dry_run, load_costs
    from kvbench.methods.gatesight.paper.preflight import check_inputs, check_out, parse_args

    console = Console(stderr=True)
    # every argument is checked here, before any work (issue 67): one line, exit 2
    args = parse_args(
        fractions=fractions, lengths=lengths, threads=threads, engine=engine, corpus=corpus, data_dir=data_dir,
        limit=limit, repeats=repeats, dtype=None if dry_run else dtype,
    )  # fmt: skip
    if render_only and results:
        raise KvbenchError("give --render-only (render --out from itself) or --results DIR (rows elsewhere), not both")
    p = shrink(
        plan(scale, _split(model) or None, corpus=corpus is not None),
        limit,
        args["lengths"],
        repeats,
        args["ps"],
    )
    if data_dir is not None:
        import os

        os.environ["KVBENCH_DATA_DIR"] = str(data_dir.resolve())
    if dry_run:
        costs = load_costs()
        if results:
            rows = _timings([Path(d) for d in _split(results)])
            if rows is None:
                raise KvbenchError(f"--results {results}: no result rows there; run kvbench paper or kvbench run first")
            costs["run"].update(costs_from_rows(rows).get("run", {}))
        Console().print("\n".join(format_dry_run(p, costs)), markup=False, highlight=False, soft_wrap=True)
        return
    check_out(out)
    if results or render_only:
        sources = [Path(d) for d in _split(results)] if results else [out]
        index = render(p, out, sources=sources)
        console.print(f"page written: {index} (and {out / 'paper.md'})", markup=False, soft_wrap=True)
        return
    check_inputs(p, corpus)  # the data and corpus the grids need: one line before any grid
    from kvbench.methods.gatesight.paper.stages import run_plan

    _mkdir(out)
    timings = run_plan(p, out, console, engine=engine, device=device, dtype=dtype, threads=threads, corpus=corpus)
    index = render(p, out, timings)
    console.print(f"page written: {index} (and {out / 'paper.md'})", markup=False, soft_wrap=True)


def _mkdir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KvbenchError(
            f"--out {out}: cannot create it ({exc.strerror or exc}); choose a writable --out or make its parent "
            "writable"
        ) from None


def _sources(sources: list[Path]) -> tuple[Path | None, list[Path]]:
    """``--results`` / ``--render-only`` sources -> (the kvbench paper directory whose cost/ and gatesight/ are
    read, or None) and the results directories whose rows are read."""
    home = next((d for d in sources if (d / "results").is_dir()), None)
    return home, [d / "results" if (d / "results").is_dir() else d for d in sources]


def render(p, out: Path, timings: list | None = None, sources: list[Path] | None = None) -> Path:
    """Measure what ``sources`` hold (default ``out``: a kvbench paper directory) for plan ``p``, render the page
    into ``out`` and write ``verdicts.json`` there, computing nothing; the HTML path. Refuses in one line when the
    sources hold no row and no stage output."""
    from kvbench.atomic import write_atomic
    from kvbench.methods.gatesight.paper.measure import measure_all
    from kvbench.methods.gatesight.paper.numbers import load_numbers
    from kvbench.methods.gatesight.paper.page import build_page, write_page
    from kvbench.methods.gatesight.paper.verdicts import STATES

    home, dirs = _sources(sources or [out])
    missing = [str(d) for d in (sources or [out]) if not d.is_dir()]
    if missing:
        raise KvbenchError(f"{', '.join(missing)}: no such directory; give a kvbench paper --out directory or results")
    df = _frame(dirs)
    measured, raw = measure_all(home or out, p, df)
    if df is None and not any(raw.values()):
        where = ", ".join(str(d) for d in (sources or [out]))
        raise KvbenchError(
            f"{where}: no result rows and no stage output for this plan (--scale {p.scale}); run kvbench paper --out "
            "DIR first, or give the directory that holds its results/"
        )
    _mkdir(out)
    blocks, verdicts = build_page(p, load_numbers(), measured, raw, df, out, timings)
    try:
        index = write_page(blocks, out)
        write_atomic(
            out / "verdicts.json",
            json.dumps(
                {
                    "scale": p.scale,
                    "models": list(p.models),
                    "states": list(STATES),
                    "verdicts": [v.to_json() for v in verdicts],
                    "measured": measured,
                },
                indent=1,
                ensure_ascii=False,
            ),
        )
    except OSError as exc:
        raise KvbenchError(
            f"--out {out}: cannot write the page ({exc.strerror or exc}); choose a writable --out"
        ) from None
    return index


app = typer.Typer(add_completion=False)
app.command("paper")(paper)
