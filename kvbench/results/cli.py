"""``kvbench results upgrade``: an older kvbench's rows given today's identity (a core command, registered in
:data:`kvbench.commands.CORE_COMMANDS`; nothing heavy is imported until it runs)."""

from __future__ import annotations

from pathlib import Path

import typer

from kvbench.logs import make_console

__all__ = ["app", "results_upgrade"]

console = make_console()

app = typer.Typer(no_args_is_help=True, help="Results directories: bring an older kvbench's rows up to date.")


@app.callback()
def _group() -> None:
    """A group even with one sub-command (``kvbench results upgrade``), also when invoked on its own."""


@app.command("upgrade")
def results_upgrade(
    dirs: list[Path] = typer.Argument(..., help="Results directories (the --out of kvbench runs)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would change; write nothing."),
) -> None:
    """Give the rows of an older kvbench today's identity where that is certain: a row lacking only
    artifact_sha256 whose method reads no calibration artifact gets null. Every other old row (GateSight's,
    TriAttention's, a method not installed here, rows lacking more) is removed from the results file; the file's
    original bytes are first saved beside it as <file>.pre-upgrade-<ns>. Afterwards runs resume into the directory
    and reports include its rows; rerun what was removed."""
    from kvbench.methods import declares_no_artifact
    from kvbench.results.upgrade import upgrade_results

    for d in dirs:
        for up in upgrade_results(d, declares_no_artifact, dry_run=dry_run):
            verb = "would upgrade" if dry_run else "upgraded"
            line = f"{up.path}: {up.current} current rows kept, {verb} {up.upgraded}"
            if not up.changed:
                line = f"{up.path}: {up.current} rows, all current; nothing to do"
            console.print(line, markup=False, soft_wrap=True)
            for reason, n in up.left_out.items():
                verb = "would remove" if dry_run else "removed"
                console.print(f"  {verb} {n}: {reason}", style="yellow", markup=False, soft_wrap=True)
            if up.backup is not None:
                console.print(f"  original saved as {up.backup}", markup=False, soft_wrap=True)
