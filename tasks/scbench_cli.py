"""``kvbench scbench generate``: SCBench rows of kv, mf, prefix_suffix and vt generated offline in the hub's
layout (a bench's command, registered in :data:`kvbench.tasks.commands.BUILTIN_COMMANDS`; nothing heavy is
imported until it runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvbench.errors import KvbenchError
from kvbench.logs import make_console
from kvbench.tasks.commands import COMMAND_HELP

__all__ = ["app", "scbench_generate"]

console = make_console()

app = typer.Typer(no_args_is_help=True, help=COMMAND_HELP["scbench"])


@app.callback()
def _group() -> None:
    """A group even with one sub-command (``kvbench scbench generate``), also when invoked on its own."""


@app.command("generate")
def scbench_generate(
    task: str = typer.Option(..., "--task", "-t", help="Task(s), comma separated: kv, mf, prefix_suffix, vt."),
    length: Optional[int] = typer.Option(
        None,
        "--length",
        help="Tokens a row may need as the model sees it (context prompt + longest question + its answer); "
        "default: the model's trained context length when it states one, else 4096.",
    ),
    limit: int = typer.Option(100, "--limit", "-n", help="Rows per task."),
    seed: int = typer.Option(42, "--seed", help="Data seed (0 to 2**32 - 1)."),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Directory: writes DIR/scbench_<task>/test-00000-of-00001.parquet (e.g. DATA/scbench)."
    ),
    model: Optional[str] = typer.Option(
        None,
        "--model",
        help="Model whose tokenizer sizes the rows: built-in name or local directory (default: tiny-trained).",
    ),
) -> None:
    """Generate SCBench rows of kv, mf, prefix_suffix and vt (kvbench's own draws in SCBench's row schema),
    each sized to --length with the model's tokenizer, and write them in the hub's parquet layout (read them
    back with `kvbench run --bench scbench --data-dir DATA` when --out is DATA/scbench)."""
    import json

    from kvbench.models import BUILTIN_MODELS, DEFAULT_LENGTH, DEFAULT_MODEL, materialize_builtin
    from kvbench.tasks.scbench import row_measure
    from kvbench.tasks.scbench_generate import GENERATED_TASKS, SEED_RANGE, generate_rows, write_hub_layout

    tasks = [t.strip() for t in task.split(",") if t.strip()]
    if not tasks or any(t not in GENERATED_TASKS for t in tasks) or len(set(tasks)) != len(tasks):
        bad = [t for t in tasks if t not in GENERATED_TASKS] or ["(none or repeated)"]
        raise KvbenchError(f"--task {', '.join(bad)}: give one or more of {', '.join(GENERATED_TASKS)}, each once")
    if limit < 1:
        raise KvbenchError(f"--limit {limit}: give the number of rows per task, at least 1")
    if not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
        raise KvbenchError(f"--seed {seed}: give an integer from {SEED_RANGE[0]} to {SEED_RANGE[1] - 1}")
    if length is not None and length < 1:
        raise KvbenchError(f"--length {length}: give a positive number of tokens")
    if out.exists() and not out.is_dir():
        raise KvbenchError(f"--out {out} is a file; give a directory")
    name = model or DEFAULT_MODEL
    path = materialize_builtin(name) if name in BUILTIN_MODELS else Path(name)
    if not path.is_dir():
        raise KvbenchError(f"--model {name}: not a built-in model ({', '.join(BUILTIN_MODELS)}) nor a local directory")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as exc:
        raise KvbenchError(f"--model {name}: cannot load its tokenizer ({exc})") from None
    if length is None:
        marker = path / "kvbench_builtin.json"
        length = (json.loads(marker.read_text()).get("context_length") if marker.is_file() else None) or DEFAULT_LENGTH
    # every row first, so that bad input (a --length too short for any row) writes nothing
    rows = {
        t: list(generate_rows(t, length=length, limit=limit, seed=seed, measure=row_measure(tok, t))) for t in tasks
    }
    for t in tasks:
        written = write_hub_layout(t, rows[t], out)
        console.print(f"{written}: {len(rows[t])} rows", markup=False, highlight=False, soft_wrap=True)
