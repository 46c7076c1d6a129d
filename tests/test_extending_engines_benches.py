"""docs/extending.md's Engines and Benches examples, installed from the page as distributions and run end to end
through ``kvbench run`` (and, for the bench, the report's reading of its sub-tasks)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.test_registry import _run_cli, write_dist

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
RUN = ["run", "--model", "tiny-random", "--p", "0.5", "--limit", "1", "--length", "900", "--threads", "1",
       "--no-reference"]  # fmt: skip


def doc_example(section: str) -> tuple[dict[str, str], dict]:
    """``## {section}`` of docs/extending.md: its python blocks by the path their first line names
    (``# mypkg/engine.py``), and its toml block parsed."""
    body = DOC.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", body, re.S)
    modules = {"mypkg/__init__.py": ""}
    for lang, text in blocks:
        if lang == "python":
            modules[text.splitlines()[0].removeprefix("# ").strip()] = text
    (toml,) = [text for lang, text in blocks if lang == "toml"]
    return modules, tomllib.loads(toml)


def install(section: str, site: Path) -> Path:
    modules, project = doc_example(section)
    return write_dist(site, project["project"]["name"], project["project"]["entry-points"], modules)


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_the_engines_example_runs_and_its_capabilities_are_checked(tmp_path):
    site = install("Engines", tmp_path / "site")
    out = tmp_path / "out"
    done = _run_cli([*RUN, "--engine", "counting-torch", "--method", "snapkv", "--out", str(out)], site)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"prefill 1: \d+ tokens", done.stdout), done.stdout
    got = rows(out)
    assert got and {r["engine"] for r in got} == {"counting-torch"} and all(r["real_fork"] for r in got)
    refused = _run_cli([*RUN, "--engine", "counting-torch", "--method", "oracle", "--out", str(tmp_path / "o")], site)
    assert refused.returncode == 2 and "runs on the torch engine only" in refused.stderr, refused.stderr
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_the_benches_example_runs_in_its_assembly_with_sub_tasks(tmp_path):
    site = install("Benches", tmp_path / "site")
    out = tmp_path / "out"
    done = _run_cli([*RUN, "--bench", "words", "--method", "snapkv", "--out", str(out)], site)
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(out)
    assert {(r["bench"], r["task"], r["scorer"]) for r in got} == {("words", "ends", "words_first"),
                                                                   ("words", "ends", "words_last")}  # fmt: skip
    instruction = len("Remember these words.\n")  # the plain assembly: no chat template around the pieces
    body = len(" ".join(f"w42x{j}" for j in range(40)))  # byte tokenizer, seed 42
    assert {r["n_context"] for r in got} == {instruction + body}
    code = f"from kvbench.report.data import load; print(sorted(set(load({str(out)!r})[0]['sub'])))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    subs = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert subs.stdout.strip() == "['first', 'last']"
