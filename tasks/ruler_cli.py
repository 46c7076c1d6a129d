"""``kvbench ruler generate``: kvbench's RULER items written in RULER's own jsonl schema (a bench's command,
registered in :data:`kvbench.tasks.commands.BUILTIN_COMMANDS`; nothing heavy is imported until it runs)."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from kvbench.errors import KvbenchError
from kvbench.logs import make_console
from kvbench.tasks.commands import COMMAND_HELP

__all__ = ["RulerTemplate", "app", "ruler_generate"]

err_console = make_console(stderr=True)

app = typer.Typer(no_args_is_help=True, help=COMMAND_HELP["ruler"])


@app.callback()
def _group() -> None:
    """A group even with one sub-command (``kvbench ruler generate``), also when invoked on its own."""


class RulerTemplate(str, Enum):
    base = "base"
    chat = "chat"


@app.command("generate")
def ruler_generate(
    *,
    tokenizer: Path = typer.Option(..., "--tokenizer", help="Hugging Face tokenizer directory."),
    task: str = typer.Option(..., "--task", "-t", help="RULER task, e.g. niah_single_1 (kvbench list benches)."),
    length: int = typer.Option(..., "--length", help="RULER's max_seq_length: prompt + generated tokens."),
    limit: int = typer.Option(100, "--limit", "-n", help="Number of samples (RULER's num_samples)."),
    seed: int = typer.Option(42, "--seed", help="RULER's random_seed."),
    template: RulerTemplate = typer.Option(
        RulerTemplate.base, "--template", help="base: RULER's base template (no chat template); chat: the tokenizer's."
    ),
    sampling: str = typer.Option("official", "--sampling", help="official (RULER's own items) or per_item."),
    out: Path = typer.Option(..., "--out", "-o", help="Output .jsonl file (replaced atomically)."),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="External data directory holding ruler/; default $KVBENCH_DATA_DIR."
    ),
) -> None:
    """Write RULER's jsonl (index, input, outputs, length, length_w_model_temp, answer_prefix, and
    token_position_answer for niah) for one task, to diff against RULER's scripts/data/prepare.py."""
    if data_dir is not None:
        if not data_dir.is_dir():
            raise KvbenchError(f"--data-dir {data_dir} is not a directory")
        os.environ["KVBENCH_DATA_DIR"] = str(data_dir.resolve())
    if not tokenizer.is_dir():
        raise KvbenchError(f"--tokenizer {tokenizer} is not a directory; pass a Hugging Face tokenizer directory")
    from transformers import AutoTokenizer

    from kvbench.tasks.ruler_jsonl import write_ruler_jsonl

    try:
        tok = AutoTokenizer.from_pretrained(str(tokenizer))
    except (OSError, ValueError) as exc:
        raise KvbenchError(f"--tokenizer {tokenizer}: cannot load a tokenizer there ({exc})") from None
    if template is RulerTemplate.base:
        tok.chat_template = None
    elif not getattr(tok, "chat_template", None):
        raise KvbenchError(f"--tokenizer {tokenizer} has no chat template; use --template base")
    n = write_ruler_jsonl(tok, task, length=length, limit=limit, seed=seed, out=out, sampling=sampling)
    err_console.print(f"[green]done:[/green] {n} {escape(task)} samples -> {escape(str(out))}")
