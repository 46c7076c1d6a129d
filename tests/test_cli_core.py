"""The command line names no method: method sub-commands mount lazily from ``kvbench.commands.COMMANDS`` (``kvbench
--help`` imports no torch), ``kvbench calibrate`` takes any method with a calibration step, ``--debug`` re-raises
user errors with their traceback, and ``kvbench report`` writes outside the (read-only) results directory."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import typer

from kvbench.commands import COMMANDS
from kvbench.errors import KvbenchError
from kvbench.methods import EvictionMethod, register_method
from tests.test_cli import LENGTH, MODEL, kvbench

PROBE = """
import json, sys, time
start = time.perf_counter()
sys.argv = ["kvbench", *sys.argv[1:]]
from kvbench import cli
code = 0
try:
    cli.main()
except SystemExit as exc:
    code = exc.code or 0
heavy = sorted(m for m in ("torch", "transformers", "kvbench.methods.gatesight") if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy, "seconds": time.perf_counter() - start}))
"""


def probe(*args: str) -> tuple[str, dict]:
    """``kvbench ARGS`` in a fresh interpreter: its output, and its exit code, the heavy modules it imported and
    its seconds from importing kvbench.cli to the end."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    out, _, last = done.stdout.rstrip().rpartition("\n")
    return out + done.stderr, json.loads(last)


def test_help_lists_method_commands_without_importing_them_or_torch():
    out, got = probe("--help")
    assert got["code"] == 0 and got["heavy"] == [], got
    assert "gatesight" in out and "--debug" in out and "calibrate" in out
    print(f"kvbench --help: {got['seconds']:.3f} s from importing kvbench.cli")  # shown with -s


def test_a_method_group_loads_on_use(capsys):
    assert kvbench("gatesight", "--help") == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("label", "train", "eval"))
    assert kvbench("gatesight", "nope") == 2
    assert "kvbench gatesight --help" in capsys.readouterr().err


hello = typer.Typer(no_args_is_help=True, help="Test commands.")


@hello.command("greet")
def _greet(name: str = typer.Option("x", "--name")) -> None:
    """Print a greeting."""
    print(f"hello {name}")


@hello.command("fail")
def _fail() -> None:
    """Raise a user error."""
    raise KvbenchError("test-commands failed on purpose")


def test_any_registered_commands_are_mounted(capsys):
    """An app added to COMMANDS (as an entry point of ``kvbench.commands`` would be) is a ``kvbench`` group."""
    if "test-commands" not in COMMANDS:
        COMMANDS.add("test-commands", hello, "tests/test_cli_core.py")
    assert kvbench("test-commands", "greet", "--name", "you") == 0
    assert "hello you" in capsys.readouterr().out
    assert kvbench("test-commands", "fail") == 2
    err = capsys.readouterr().err
    assert "test-commands failed on purpose" in err and "Traceback" not in err
    with pytest.raises(KvbenchError, match="on purpose"):  # --debug after the command, too
        kvbench("test-commands", "fail", "--debug")


class CalibratedForTest(EvictionMethod):
    """Keeps the first entries; calibration writes the documents it was given (a method defined outside)."""

    name = "test-calibrated"

    def score(self, parent):
        return [-parent.keys(f).float()[..., 0] for f in range(parent.n_attn_layers)]

    @classmethod
    def calibrate(cls, lm, texts, *, max_tokens, out):
        target = Path(out) if out is not None else Path("calibrated.json")
        target.write_text(json.dumps({"model": lm.name, "texts": texts, "max_tokens": max_tokens}))
        return target


register_method(CalibratedForTest)


def test_calibrate_takes_any_method_with_a_calibration_step(tmp_path, capsys):
    corpus = tmp_path / "corpus" / "kind"
    corpus.mkdir(parents=True)
    (corpus / "a.txt").write_text("alpha beta")
    out = tmp_path / "stats.json"
    args = ["--corpus", str(tmp_path / "corpus"), "--max-tokens", "64", "--out", str(out)]
    assert kvbench("calibrate", "test-calibrated", *MODEL, *args) == 0, capsys.readouterr().err
    assert json.loads(out.read_text()) == {"model": "tiny-random", "texts": ["alpha beta"], "max_tokens": 64}
    assert f"calibrated test-calibrated for tiny-random -> {out}" in capsys.readouterr().err.replace("\n", "")
    assert kvbench("calibrate", "full", *args) == 2
    err = capsys.readouterr().err
    assert "method full has no calibration step" in err and "test-calibrated" in err and "triattention" in err
    assert kvbench("calibrate", "nope", *args) == 2
    assert "valid methods" in capsys.readouterr().err


@register_method
class RaisesForTest(EvictionMethod):
    """Raises a user error while scoring (a plugin author's mistake)."""

    name = "test-raises"

    def score(self, parent):
        raise KvbenchError("test-raises cannot score this")


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_reraises_with_the_traceback(tmp_path, capsys, where):
    args = ["run", *MODEL, "--method", "test-raises", "--p", "0.5", "--limit", "1", "--length", LENGTH]
    args += ["--out", str(tmp_path / "o")]
    assert kvbench(*args) == 2
    err = capsys.readouterr().err
    # one line (a pytest-only "Logging error" of an earlier test's closed capture stream may precede it)
    assert err.rstrip().endswith("error: test-raises cannot score this") and ", in score" not in err
    debug = ["--debug", *args] if where == "before" else [*args[:1], "--debug", *args[1:]]
    with pytest.raises(KvbenchError, match="cannot score this") as info:
        kvbench(*debug)
    assert any(frame.name == "score" for frame in info.traceback)  # raised where the method raised it
    assert "KVBENCH_DEBUG" not in os.environ  # restored after the command


def test_debug_reaches_a_method_commands_own_error_handling(tmp_path):
    """GateSight's commands print one line themselves; under --debug they re-raise too."""
    with pytest.raises(KvbenchError, match="kvbench gatesight label"):
        kvbench("--debug", "gatesight", "train", "--labels", str(tmp_path / "nowhere"))


def test_debug_in_a_subprocess_prints_the_traceback(tmp_path):
    args = [sys.executable, "-m", "kvbench.cli", "--debug", "report", "--results", str(tmp_path)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback (most recent call last)" in done.stderr
    assert "Error: no result" in done.stderr.splitlines()[-1]  # the exception's own last line
    quiet = subprocess.run(args[:3] + args[4:], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr and quiet.stderr.startswith("error: no result")


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_report_of_a_read_only_results_directory(tmp_path, monkeypatch, capsys):
    """The default --out is reports/<results dir name> in the current directory: a read-only results directory
    gets its full report, exit 0, and nothing in it changes."""
    res = tmp_path / "ro-run"
    run = ["run", *MODEL, "--method", "full,random", "--p", "0.5", "--limit", "2", "--length", LENGTH]
    assert kvbench(*run, "--out", str(res)) == 0, capsys.readouterr().err
    before = _tree(res)
    modes = {p: p.stat().st_mode for p in [res, *res.rglob("*")]}
    for p in modes:
        p.chmod(stat.S_IMODE(modes[p]) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        monkeypatch.chdir(tmp_path)
        time.sleep(0.01)  # an mtime change would show
        assert kvbench("report", "--results", str(res), "--bootstrap", "200") == 0, capsys.readouterr().err
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    assert _tree(res) == before
    report = tmp_path / "reports" / "ro-run"
    md = (report / "report.md").read_text()
    assert (report / "index.html").stat().st_size > 0 and any((report / "figures").glob("*.png"))
    # no gatesight and no kvzip in the rows: the stated choices, in the notes and on stderr
    assert "## Notes" in md and "CI reference: random, the best mean" in md and "Every method against Random" in md
    err = capsys.readouterr().err.replace("\n", " ")  # on the terminal only what the user can act on, with its flag
    assert "comparison: random, the CI reference" not in err and "no gatesight" not in err
    # the suggestion: the first registered method the rows lack (the reference aside)
    assert "note: for confidence intervals add a method: --method random,gatesight" in err


def test_a_missing_training_distribution_names_its_pip_command(monkeypatch, capsys):
    """Without kvbench-training installed (no ``train-tiny`` entry point: an empty registry stands in for it),
    ``kvbench train-tiny`` is one error line naming the pip command, exit 2, not click's "No such command"."""
    from kvbench import commands
    from kvbench.registry import Registry

    monkeypatch.setattr(commands, "COMMANDS", Registry("command", "kvbench.test-no-commands", {}))
    assert kvbench("train-tiny", "--steps", "1") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install -e training/" in err and "No such command" not in err, err
    assert kvbench("no-such-command") == 2  # any other unknown name stays click's usage error
    assert "No such command" in capsys.readouterr().err


def test_train_tiny_comes_from_the_training_distribution():
    """``train-tiny`` is no core command: the kvbench-training distribution's entry point registers it."""
    import typer

    from kvbench import cli

    assert "train-tiny" not in typer.main.get_command(cli.app).commands
    assert "entry point kvbench_training.cli:app (dist kvbench-training" in COMMANDS.source("train-tiny")


def _doc_blocks(section: str) -> dict[str, str]:
    """The fenced code blocks of ``## {section}`` in docs/extending.md: language -> text."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"```(\w+)\n(.*?)```", body, re.S))


def test_the_commands_example_of_docs_extending_runs(tmp_path):
    """docs/extending.md's Commands example, installed as a distribution: listed by ``kvbench --help`` with its
    description (the app not imported), and ``kvbench mybench prepare`` runs."""
    from tests.test_registry import _run_cli, write_dist

    blocks = _doc_blocks("Commands")
    project = tomllib.loads(blocks["toml"])
    points = project["project"]["entry-points"]
    modules = {"mypkg/__init__.py": "", "mypkg/cli.py": blocks["python"]}
    site = write_dist(tmp_path / "site", project["project"]["name"], points, modules)
    metadata = site / "mypkg-0.1.dist-info" / "METADATA"
    metadata.write_text(metadata.read_text() + f"Summary: {project['project']['description']}\n")
    listed = _run_cli(["--help"], site)
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"mybench\s+MyBench: prepare and check its items\.", listed.stdout), listed.stdout
    done = _run_cli(["mybench", "prepare", "--n", "5"], site)
    assert done.returncode == 0 and "prepared 5 items" in done.stdout, done.stdout + done.stderr
    assert "check" in _run_cli(["mybench", "--help"], site).stdout
