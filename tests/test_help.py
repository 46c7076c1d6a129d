"""Every ``kvbench <command> --help`` (the whole command tree, registered commands included) checked against the
code: a default the help states, as typer's ``[default: X]`` tag or in the prose, is the one the code uses, a flag
shows no value placeholder (``<bool>``) as if it took a value, and no ``--help`` imports torch or transformers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from enum import Enum

import click
import pytest

from kvbench import cli
from kvbench.checkpoints import shape
from kvbench.distributed import RayOptions
from kvbench.methods.gatesight.paper.artifacts import ALL_P, Grid, plan
from kvbench.models import BUILTIN_DIR, DEFAULT_LENGTH, DEFAULT_MODEL
from kvbench.run.plan import ANSWER_CONTEXTS
from kvbench_training.data import DEFAULT_CURRICULUM
from kvbench_training.loop import DEFAULT_STEPS
from tests.test_cli import kvbench

TINY_LENGTH = json.loads((BUILTIN_DIR / "tiny-trained" / "kvbench_builtin.json").read_text())["context_length"]
CURRICULUM = ",".join(f"{length}@{start:g}" for start, length in DEFAULT_CURRICULUM)

PAPER_COST_LENGTHS = {
    scale: next(g.lengths for g in plan(scale, models=["m"] if scale == "paper" else None).grids if g.kind == "cost")
    for scale in ("tiny", "paper")
}
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
#: (command, option) -> what its help must say about the default, computed from the code.
STATED: dict[tuple[str, str], str] = {
    ("run", "--model"): f"(default: {DEFAULT_MODEL})",
    ("run", "--length"): f"{TINY_LENGTH} for tiny-trained; {DEFAULT_LENGTH} for a model that states none",
    ("run", "--answer-contexts"): f"Default {ANSWER_CONTEXTS}.",
    ("run", "--workers"): f"(default {RayOptions.__dataclass_fields__['workers'].default})",
    ("run", "--data-dir"): "default $KVBENCH_DATA_DIR",
    ("run", "--shape-layers"): f"{shape.DEFAULT_LAYERS} (one 3 GDN : 1 attention cycle, the default)",
    ("ruler generate", "--data-dir"): "default $KVBENCH_DATA_DIR",
    ("data fetch", "--data-dir"): "default $KVBENCH_DATA_DIR",
    ("paper", "--data-dir"): "default $KVBENCH_DATA_DIR",
    ("cost", "--model"): f"(default: {DEFAULT_MODEL})",
    ("calibrate", "--model"): f"(default: {DEFAULT_MODEL})",
    ("scbench generate", "--model"): f"(default: {DEFAULT_MODEL})",
    ("scbench generate", "--length"): f"else {DEFAULT_LENGTH}.",
    ("train-tiny", "--steps"): f"(default: {DEFAULT_STEPS:,}, the shipped run)",
    ("train-tiny", "--curriculum"): f"(default: {CURRICULUM})",
    ("paper", "--repeats"): f"(default {Grid.__dataclass_fields__['repeats'].default})",
    ("paper", "--p"): f"(default: the paper's {NUMBER_WORDS[len(ALL_P)]}, {max(ALL_P)} to {min(ALL_P)})",
    ("paper", "--lengths"): "(default: {} tiny; {}K to {}K paper)".format(
        ",".join(map(str, PAPER_COST_LENGTHS["tiny"])),
        min(PAPER_COST_LENGTHS["paper"]) // 1024,
        max(PAPER_COST_LENGTHS["paper"]) // 1024,
    ),
}
#: Options whose prose default is a rule, not a value (nothing in it to compare with a constant).
RULES = {
    ("run", "--task"), ("run", "--allocation"), ("run", "--dtype"), ("run", "--answer-batch"),
    ("report", "--out"), ("report", "--reference"), ("report", "--compare"), ("report", "--cost"),
    ("calibrate", "--out"), ("train-tiny", "--mix"), ("gatesight label", "--dtype"), ("gatesight train", "--out"),
    ("paper", "--dtype"), ("cost", "--dtype"), ("calibrate", "--dtype"),  # the shared kvbench.options.DTYPE
}
TAG = re.compile(r"\[default: ([^\]]*)\]")
PROSE_DEFAULT = re.compile(r"(?<!non-)\bdefault\b", re.IGNORECASE)


def _commands(cmd: click.Command, path: tuple[str, ...] = ()):
    """(path, command) for ``cmd`` and every command under it."""
    yield path, cmd
    if hasattr(cmd, "list_commands"):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            yield from _commands(cmd.get_command(ctx, name), (*path, name))


COMMANDS = list(_commands(cli.command_group()))


def _params(cmd: click.Command) -> list[click.Parameter]:
    params = (cmd.load() if hasattr(cmd, "load") else cmd).params
    return [*params, cmd.get_help_option(click.Context(cmd))]


def _rows(path: tuple[str, ...], monkeypatch, capsys) -> dict[str, str]:
    """``kvbench <path> --help`` rendered wide enough for one line per option: {long option: its row}."""
    monkeypatch.setenv("COLUMNS", "600")
    code = kvbench(*path, "--help")
    text = capsys.readouterr().out
    assert code == 0, text
    rows = {}
    for line in text.splitlines():
        m = re.match(r"│\s+(?:\*\s+)?(--[\w-]+)", line)
        if m:
            rows[m[1]] = line.strip("│ ")
    assert "--help" in rows, text
    return rows


def _shown(value) -> str:
    """A default as typer's tag shows it."""
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def test_the_tree_is_walked():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"run", "report", "ruler generate", "scbench generate", "gatesight label", "results upgrade",
            "data fetch"} <= names


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "kvbench")
def test_help_states_the_real_defaults(path, monkeypatch, capsys):
    cmd = dict(COMMANDS)[path]
    rows = _rows(path, monkeypatch, capsys)
    where = " ".join(path)
    for param in _params(cmd):
        if param.param_type_name != "option" or param.hidden:  # typer's own click copy: no isinstance
            continue
        long = next(o for o in param.opts if o.startswith("--"))
        row = rows[long]
        if param.is_flag:
            # a flag takes no value: nothing between its names and its help that reads as a value placeholder
            assert "<bool>" not in row and not re.search(r"\s<\w+>\s", row.split(param.help or "\0")[0]), row
        tag = TAG.search(row)
        if tag:
            real = param.default
            if param.is_flag and param.secondary_opts:  # --resume/--no-resume [default: resume]
                real = (param.opts if param.default else param.secondary_opts)[0].lstrip("-")
            assert tag[1] == _shown(real), f"{where} {long}: help says {tag[1]!r}, the code uses {real!r}"
        prose = TAG.sub("", row)
        key = (where, long)
        if key in STATED:
            assert STATED[key] in prose, f"{where} {long}: help should say {STATED[key]!r}: {row}"
        elif PROSE_DEFAULT.search(prose):
            assert key in RULES, f"{where} {long} states a default in its help; add it to STATED (or RULES): {row}"
            said = prose[PROSE_DEFAULT.search(prose).start():]
            number = re.search(r"(?<![\w.<])\d", said)
            assert not number, f"{where} {long}: a number in a rule default goes in STATED: {row}"


def test_every_listed_option_exists():
    known = {(" ".join(p), o) for p, cmd in COMMANDS for prm in _params(cmd) for o in prm.opts}
    missing = sorted((set(STATED) | RULES) - known)
    assert not missing, f"STATED/RULES name options the commands lack: {missing}"


#: Forks once per command path from one interpreter that imported kvbench.cli (and nothing heavy): each child runs
#: ``kvbench PATH --help`` and reports which heavy modules it imported. Forking keeps the ~40 runs to seconds.
HELP_PROBE = """
import json, os, sys
from kvbench import cli
HEAVY = ("torch", "transformers")
before = [m for m in HEAVY if m in sys.modules]
found = {}
for path in json.load(sys.stdin):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        sys.argv = ["kvbench", *path, "--help"]
        code = 0
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code or 0
        os.write(write, json.dumps({"code": code, "heavy": [m for m in HEAVY if m in sys.modules]}).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        found[" ".join(path) or "kvbench"] = json.loads(pipe.read() or '{"code": "crashed", "heavy": []}')
    os.waitpid(pid, 0)
print(json.dumps({"before": before, "found": found}))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the probe forks one child per command (POSIX only)")
def test_no_help_imports_torch():
    """``kvbench <path> --help`` for every command and sub-command of the tree (registered ones included)
    exits 0 without importing torch or transformers."""
    paths = [list(p) for p, _ in COMMANDS]
    names = {" ".join(p) for p in paths}  # the whole tree: core commands, registered groups and sub-commands
    assert {"run", "train-tiny", "ruler generate", "scbench generate", "gatesight label", "paper"} <= names
    done = subprocess.run([sys.executable, "-c", HELP_PROBE], input=json.dumps(paths), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["before"] == [], f"importing kvbench.cli alone imports {got['before']}"
    assert set(got["found"]) == {name or "kvbench" for name in names}
    bad = {path: r for path, r in got["found"].items() if r["code"] != 0 or r["heavy"]}
    assert not bad, f"--help failed or imported torch/transformers: {bad}"
