"""``kvbench paper`` end to end on a drastically reduced tiny grid (one item per task, one label document per
kind, the cost grid at 256 tokens once): every stage runs on both shipped models, the page lists every artifact,
every finding gets a verdict, and a rerun resumes (no stage redoes its work). Slow: about 10-20 minutes on 2
cores, so marked ``slow`` (``pytest -m slow``)."""

from __future__ import annotations

import json

import pytest

from kvbench.paper.artifacts import ARTIFACTS
from kvbench.paper.numbers import load_numbers
from tests.test_cli import kvbench


@pytest.mark.slow
def test_reduced_tiny_grid_end_to_end(tmp_path):
    out = tmp_path / "paper"
    args = ["paper", "--out", str(out), "--limit", "1", "--lengths", "256", "--repeats", "1", "--threads", "2"]
    assert kvbench(*args) == 0
    html = (out / "index.html").read_text()
    for art in ARTIFACTS:
        assert f'id="{art.id}"' in html
    verdicts = json.loads((out / "verdicts.json").read_text())
    assert len(verdicts["verdicts"]) == len(load_numbers().findings)
    assert verdicts["models"] == ["tiny-trained-dense", "tiny-trained"]
    rows = (out / "results" / "results.jsonl").read_text().splitlines()
    models = {json.loads(r)["model"] for r in rows}
    assert models == {"tiny-trained-dense", "tiny-trained"}
    for name in ("cost/tiny-trained.json", "gatesight/tiny-trained-dense/eval-short-w6.json",
                 "gatesight/tiny-trained-dense/dynamics-short.json"):  # fmt: skip
        assert (out / name).stat().st_size > 0
    # a rerun resumes: no row is written twice, the page is rendered again
    assert kvbench(*args) == 0
    assert (out / "results" / "results.jsonl").read_text().splitlines() == rows
