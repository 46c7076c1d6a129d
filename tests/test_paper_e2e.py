"""``kvbench paper`` end to end (slow: run with ``-m slow``): the whole tiny pipeline on a reduced grid (one item
per task and one label document per kind, the run grids at p = 0.1 only, the cost grid at 4,096 tokens once) into
a temporary directory, both shipped models, offline. The page must list every artifact (or its reason), show the
paper's numbers beside measured ones for every artifact that has paper numbers, and give a verdict per finding.
About 5 minutes on 2 idle cores."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvbench.methods.gatesight.paper import artifacts as A
from kvbench.methods.gatesight.paper.numbers import load_numbers
from kvbench.methods.gatesight.paper.verdicts import STATES

REDUCED = ["--limit", "1", "--p", "0.1", "--lengths", "4096", "--repeats", "1", "--threads", "1"]


def _section(md: str, art: A.Artifact) -> str:
    return md.split(f"## {art.title}: {art.caption}")[1].split("\n## ")[0]


def _cells(line: str) -> list[str]:
    """A Markdown table row's cells (``\\|`` inside a cell is no separator)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def _measured_cells(section: str) -> list[str]:
    """The "measured" column of the section's paper-beside-kvbench table (the one headed ``| source | row |``)."""
    if "\n| source | row |" not in section:
        return []
    table = section.split("\n| source | row |")[1].split("\n\n")[0].splitlines()
    col = _cells("| source | row |" + table[0]).index("measured (tiny-model number)")
    return [_cells(line)[col] for line in table[2:]]


def _paper(out: Path) -> float:
    """Run the reduced ``kvbench paper`` into ``out`` (offline, one thread); its wall seconds."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "kvbench.cli", "paper", "--out", str(out), *REDUCED],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return time.perf_counter() - start


@pytest.mark.slow
def test_paper_tiny_reduced_end_to_end(tmp_path):
    out = tmp_path / "paper-tiny"
    wall = _paper(out)
    print(f"kvbench paper {' '.join(REDUCED)}: {wall:.0f} s")
    measured = _check_page(out)
    # a rerun resumes: nothing is recomputed, the page is rendered again
    assert _paper(out) < wall / 2
    assert json.loads((out / "verdicts.json").read_text(encoding="utf-8"))["measured"] == measured


def _check_page(out: Path) -> dict:
    """Assert what the issue asks of the page in ``out``; the measured values of ``verdicts.json``."""
    md = (out / "paper.md").read_text(encoding="utf-8")
    html = (out / "index.html").read_text(encoding="utf-8")
    numbers = load_numbers()
    p = A.plan("tiny")
    # every artifact: its heading, and either its reason or its grids' outputs (no "no result rows yet")
    for pa in p.artifacts:
        assert f'id="{pa.artifact.id}"' in html, pa.artifact.id
        section = _section(md, pa.artifact)
        assert "no result rows yet" not in section, pa.artifact.id
        if pa.reason:
            assert f"Not reproduced at --scale tiny: {pa.reason}" in section
        if pa.partial:
            assert f"Partly reproduced: {pa.partial}" in section
        # the paper's numbers beside measured ones: every artifact with paper numbers has some measured
        if numbers.for_artifact(pa.artifact.id):
            measured = _measured_cells(section)
            assert measured and any(c not in ("—", "") for c in measured), pa.artifact.id
    table6 = next(a for a in A.ARTIFACTS if a.id == "table6")
    assert "8K row is not reproducible at tiny scale" in _section(md, table6)
    # one verdict per finding, each decided or said not measurable, on the page and in verdicts.json
    verdicts = json.loads((out / "verdicts.json").read_text(encoding="utf-8"))
    assert verdicts["scale"] == "tiny" and verdicts["models"] == list(A.TINY_MODELS)
    assert sorted(v["id"] for v in verdicts["verdicts"]) == sorted(f["id"] for f in numbers.findings)
    assert {v["status"] for v in verdicts["verdicts"]} <= set(STATES)
    assert sum(md.count(f"**{s}**") for s in STATES) == len(numbers.findings)
    # every stage ran and wrote its output: the cells analysis, the 4K labels, both models' run rows and costs
    for model in A.TINY_MODELS:
        assert (out / "cost" / f"{model}.json").is_file()
    gs = out / "gatesight" / "tiny-trained-dense"
    assert (gs / "cells-short.json").is_file() and (gs / "eval-4k.json").is_file()
    assert any(k.startswith('{"kind": "cells"') for k in verdicts["measured"])
    figures = {f.name.split("-")[0] for f in (out / "figures").iterdir()}
    assert {"fig1", "fig2", "fig4", "fig6", "fig8", "figs9_12", "table4"} <= figures
    return verdicts["measured"]
