"""End to end: a real small run through the CLI (tiny random model), `kvbench cost`, `kvbench report`, then the
page opened in headless Chromium (Debian's ``chromium`` driven by Playwright): every figure loads, no console
error, no network request, and the numbers of every main table on the page equal its CSV."""

from __future__ import annotations

import io
import json
import math
import shutil

import pandas as pd
import pytest

from kvbench.report import render
from tests.test_cli import MODEL, kvbench

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: a SCBench setting's title as the issue saw it clipped on both sides of the mean-accuracy figure
LONG_TITLE = ("tiny-trained (982bbbf2da78) · torch · SCBench (generated offline: scbench_kv, scbench_mf, "
              "scbench_prefix_suffix, scbench_vt) · length 4096 · seed 42")
#: the page must fit this viewport width (px) without horizontal scrolling
PAGE_WIDTH = 1400
#: [viewport width, elements past it that no scrolling box of theirs holds] on the page
OVERFLOW_JS = """() => {
  const width = document.documentElement.clientWidth;
  const boxed = el => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement)
      if (getComputedStyle(a).overflowX !== "visible") return true;
    return false;
  };
  const out = [];
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width && r.right > width + 0.5 && !boxed(el)) out.push([el.tagName, el.id || el.className, r.right]);
  }
  return [width, document.documentElement.scrollWidth, out];
}"""
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    """A run of full, random and keydiff (flat and pyramid), a cost file, and the rendered report."""
    tmp = tmp_path_factory.mktemp("report")
    res, out = tmp / "run", tmp / "report"
    # every p: the CI and memory tables as wide as a real report's (they ran past 1,400 px before)
    args = ["run", *MODEL, "--method", "full,random,keydiff", "--allocation", "flat,pyramid", "--p", "all",
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
            page = browser.new_page(viewport={"width": PAGE_WIDTH, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            page.goto((out / "index.html").as_uri(), wait_until="load")
            images = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth])")
            tables = page.eval_on_selector_all(
                "table.main",
                "els => els.map(t => [t.dataset.csv, [...t.rows].map(r => [...r.cells].map(c => c.innerText))])",
            )
            width, scroll_width, overflowing = page.evaluate(OVERFLOW_JS)
        finally:
            browser.close()
    assert errors == [] and requests == []
    assert width == PAGE_WIDTH and scroll_width <= width and overflowing == [], overflowing[:10]
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


def _edges_blank(png: bytes) -> bool:
    """Whether the outermost 2 pixels of every side of a PNG are background (nothing drawn runs off the image)."""
    import matplotlib.image

    rgb = matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3]
    edges = [rgb[:2], rgb[-2:], rgb[:, :2], rgb[:, -2:]]
    return all(float(e.min()) > 0.9 for e in edges)


def test_every_figure_of_the_report_keeps_its_title_inside(report_dir):
    _, out = report_dir
    pngs = sorted((out / "figures").glob("*.png"))
    assert pngs
    for png in pngs:
        assert _edges_blank(png.read_bytes()), f"{png.name}: something (its title?) runs off the image"


@pytest.mark.parametrize("kind", ["averaged", "tasks"])
def test_a_long_setting_title_is_not_clipped(kind):
    """The issue's SCBench title, drawn the way the report draws figures: no ink on the image's edges, and every
    title line no wider than the figure it is drawn on."""
    rows = [dict(label=lab, method=lab.split()[0], p=p, score=s, query_aware=False, n_tasks=4, task=t)
            for lab, s in (("full", 90.0), ("snapkv [pyramid]", 60.0)) for p in (1.0, 0.5, 0.1)
            for t in ("scbench_kv", "scbench_vt")]  # fmt: skip
    frame = pd.DataFrame(rows)
    palette = {"snapkv [pyramid]": (0.1, 0.2, 0.8)}
    title = f"mean over 4 tasks — {LONG_TITLE}" if kind == "averaged" else LONG_TITLE
    job = (kind, frame, title, palette) if kind == "averaged" else (kind, frame, title, palette, None)
    png, _ = render._draw(job)
    assert _edges_blank(png)
    from kvbench.report import figures

    fig = figures.averaged_curves(frame, title, palette) if kind == "averaged" else figures.per_task_curves(
        frame, title, palette)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    texts = [ax.title for ax in fig.axes] + ([fig._suptitle] if fig._suptitle else [])
    titles = [t for t in texts if t.get_text() and "·" in t.get_text()]
    assert titles
    for t in titles:
        box = t.get_window_extent(renderer)
        assert box.x0 >= fig.bbox.x0 and box.x1 <= fig.bbox.x1, (t.get_text(), box, fig.bbox)


def test_the_mixed_task_caption_only_where_a_mixed_task_is(report_dir):
    _, out = report_dir
    page = (out / "index.html").read_text()
    assert "Mean over tasks: " in page and "Mixed SCBench" not in page  # a needle run has no mixed task
    assert "Mixed SCBench" in render._averaged_caption(pd.DataFrame({"sub": ["", "kv"], "bench": ["scbench"] * 2}))
    assert "Mixed SCBench" not in render._averaged_caption(pd.DataFrame({"sub": ["", ""], "bench": ["scbench"] * 2}))
    # a bench with sub-tasks captions its own (the base's sentence for one that declares none; a plugin such as
    # docs/extending.md's words), never SCBench's
    other = render._averaged_caption(pd.DataFrame({"sub": ["first", "last"], "bench": ["words"] * 2}))
    assert "Mixed SCBench" not in other and "Tasks with sub-tasks enter as the mean of their sub-task scores" in other
