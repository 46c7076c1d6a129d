"""The command registry: every ``kvbench <name> …`` that is not one of the core commands of :mod:`kvbench.cli`.

One :class:`~kvbench.registry.Registry` (:data:`COMMANDS`, entry-point group ``kvbench.commands``) holds a
typer app per name, mounted by the command line as ``kvbench <name> …`` and imported only when that name is
used (``kvbench --help`` lists the names without importing any app). Every kind of extension adds to it:

* the core's own (``results``): :data:`CORE_COMMANDS`;
* packages that ship built-in commands (the benches' ``data``, ``ruler`` and ``scbench``, the methods' ``gatesight`` and
  ``paper``): each package in :data:`CONTRIBUTORS` has a table ``BUILTIN_COMMANDS`` (name -> ``"module:app"``)
  and may have ``COMMAND_HELP`` (name -> the line ``kvbench --help`` lists it with);
* installed distributions, through entry points of group ``kvbench.commands`` (``train-tiny =
  kvbench_training.cli:app`` in the ``kvbench-training`` distribution; ``keynorm = mypkg.cli:app`` in a
  plugin): listed with their distribution's summary line.

An app of one command is that command (``kvbench paper``, ``kvbench train-tiny``); an app of several is a
group (``kvbench gatesight label``). A name taken twice is an error naming both sources.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from kvbench.registry import Registry, RegistryError, load_spec

__all__ = ["COMMANDS", "CONTRIBUTORS", "CORE_COMMANDS", "MISSING_HINTS", "builtin_commands", "short_help"]

#: The core's commands that live outside kvbench/cli.py's app: name -> "module:typer app".
CORE_COMMANDS: dict[str, str] = {
    "results": "kvbench.results.cli:app",
}

#: Packages whose ``BUILTIN_COMMANDS`` (and ``COMMAND_HELP``) tables add built-in commands, in listing order.
CONTRIBUTORS: tuple[str, ...] = ("kvbench.tasks", "kvbench.methods")

#: Commands of the project's separately installed distributions: name -> how to install the one that has it.
MISSING_HINTS: dict[str, str] = {
    "train-tiny": "pip install -e training/ (from the kvbench checkout; scripts/setup.sh does it)",
}


def _tables(attr: str) -> list[tuple[str, dict[str, str]]]:
    """(contributor, its table ``attr``) for every contributor that has one (imports the packages only)."""
    found = []
    for module in CONTRIBUTORS:
        table = getattr(importlib.import_module(module), attr, None)
        if table is not None:
            found.append((module, dict(table)))
    return found


def builtin_commands() -> dict[str, str]:
    """Every built-in command, name -> "module:typer app": the core's, then each contributor's. A name two
    of them claim is a :class:`~kvbench.registry.RegistryError` naming both."""
    table = dict(CORE_COMMANDS)
    owner = {name: "kvbench.commands" for name in table}
    for module, commands in _tables("BUILTIN_COMMANDS"):
        for name, spec in commands.items():
            if name in table:
                raise RegistryError(f"command {name!r} is a built-in of both {owner[name]} and {module}")
            table[name], owner[name] = spec, module
    return table


def short_help(name: str) -> str | None:
    """The line ``kvbench --help`` lists command ``name`` with: a core app's own help (its module is light),
    a contributor's ``COMMAND_HELP`` entry, or the summary of the distribution whose entry point registers it
    (no plugin imported); None when none of them says anything."""
    if name in CORE_COMMANDS:  # the core's apps are light (typer and kvbench.errors): their own help
        return load_spec(CORE_COMMANDS[name]).info.help
    helps: dict[str, str] = {}
    for _, table in _tables("COMMAND_HELP"):
        helps.update(table)
    if name in helps:
        return helps[name]
    for ep in entry_points(group=COMMANDS.group, name=name):
        summary = ep.dist.metadata.get("Summary") if ep.dist is not None else None
        if summary:
            return summary
    return None


#: Every command outside the core app: built-ins and ``kvbench.commands`` entry points (typer apps).
COMMANDS: Registry[Any] = Registry("command", "kvbench.commands", builtin_commands())
