"""End to end: a real small run through the CLI (tiny random model), `kvbench cost`, `kvbench report`, then the
page opened in headless Chromium (Debian's ``chromium`` driven by Playwright): every figure loads, no console
error, no network request, and the numbers of every main table on the page equal its CSV."""

from __future__ import annotations

import json
import math
import shutil

import pandas as pd
import pytest

from tests.test_cli import MODEL, kvbench

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    """A run of full, random and keydiff (flat and pyramid), a cost file, and the rendered report."""
    tmp = tmp_path_factory.mktemp("report")
    res, out = tmp / "run", tmp / "report"
    args = ["run", *MODEL, "--method", "full,random,keydiff", "--allocation", "flat,pyramid", "--p", "0.5,0.1",
            "--limit", "2", "--length", "900", "--out", str(res)]  # fmt: skip
    assert kvbench(*args) == 0
    assert kvbench("cost", *MODEL, "--method", "random,keydiff", "--lengths", "128", "--repeats", "1",
                   "--out", str(res / "cost.json")) == 0  # fmt: skip
    code = kvbench("report", "--results", str(res), "--out", str(out), "--reference", "random", "--bootstrap", "500")
    assert code == 0
    return res, out


def test_report_directory_contents(report_dir):
    res, out = report_dir
    for name in ("index.html", "report.md"):
        assert (out / name).stat().st_size > 0
    stems = {p.stem for p in (out / "tables").iterdir()}
    for p in (out / "tables").glob("*.csv"):
        assert (out / "tables" / f"{p.stem}.tex").read_text().count("\\toprule") == 1
    kinds = {s.split("-")[0] for s in stems}
    assert {"main", "ci", "ablation", "memory", "cost", "counts"} <= kinds
    figs = sorted(p.name for p in (out / "figures").iterdir())
    assert any(f.startswith("averaged-") and f.endswith(".pdf") for f in figs)
    assert any(f.startswith("tasks-") and f.endswith(".png") for f in figs)
    md = (out / "report.md").read_text()
    assert "Model weights are random" in md and "keydiff [pyramid]" in md and "Allocation ablation" in md
    assert list(res.glob("results*.jsonl")) == [res / "results.jsonl"]  # the report wrote no results file
    # the memory view: the manifest's model shape gives the same bytes per token the engine measured
    mem = pd.read_csv(next((out / "tables").glob("memory-*.csv")))
    assert (mem.full_per_token == mem.measured_per_token).all()
    shape = json.loads((res / "manifest.json").read_text())["runs"][0]["model_shape"]
    assert shape["n_attn_layers"] == 3 and shape["n_kv_heads"] == 2 and shape["weight_bytes"] > 0


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (`apt-get install -y chromium`; .ci/run does)")
def test_page_in_headless_chromium(report_dir):
    from playwright.sync_api import sync_playwright

    _, out = report_dir
    errors, requests = [], []
    with sync_playwright() as pw:
        # Playwright gives the browser a fresh temporary profile itself (it refuses --user-data-dir here)
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            page.goto((out / "index.html").as_uri(), wait_until="load")
            images = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth])")
            tables = page.eval_on_selector_all(
                "table.main",
                "els => els.map(t => [t.dataset.csv, [...t.rows].map(r => [...r.cells].map(c => c.innerText))])",
            )
        finally:
            browser.close()
    assert errors == [] and requests == []
    assert len(images) >= 2 and all(done and width > 0 for done, width in images)
    assert tables
    for csv, cells in tables:
        want = pd.read_csv(out / csv)
        assert cells[0] == list(want.columns)
        assert len(cells) - 1 == len(want)
        for shown, (_, expected) in zip(cells[1:], want.iterrows(), strict=True):
            assert shown[0] == expected.iloc[0]
            numbers = ["" if math.isnan(v) else f"{v:.1f}" for v in expected.iloc[1:]]
            assert shown[1:] == numbers
