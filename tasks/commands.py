"""The benches' built-in commands (``kvbench data fetch``, ``kvbench ruler generate``, ``kvbench scbench
generate``), added to the command registry :data:`kvbench.commands.COMMANDS`; a plugin bench adds its own through
the ``kvbench.commands`` entry-point group."""

from __future__ import annotations

__all__ = ["BUILTIN_COMMANDS", "COMMAND_HELP"]

#: name (``kvbench <name> …``) -> "module:typer app"
BUILTIN_COMMANDS: dict[str, str] = {
    "data": "kvbench.tasks.data_fetch:data_app",
    "ruler": "kvbench.tasks.ruler_cli:app",
    "scbench": "kvbench.tasks.scbench_cli:app",
}

#: name -> the line ``kvbench --help`` lists it with (the app's own help, so the two never differ)
COMMAND_HELP: dict[str, str] = {
    "data": "The benches' external data (RULER's essays and QA sets, SCBench from the hub).",
    "ruler": "RULER: write kvbench's RULER items in RULER's own jsonl schema.",
    "scbench": "SCBench: generate kv, mf, prefix_suffix and vt rows offline, in the hub's layout.",
}
