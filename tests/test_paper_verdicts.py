"""``kvbench paper --results DIR``: made-up rows rendered into verdicts without computing anything, one finding per
state of issue 62 (held, contradicted, not resolved on ties at 0, partly measured on 1 case of 54 and on missing
comparators, a comparator at the floor), each checked in ``verdicts.json`` and on the page; and every argument of
``kvbench paper`` refused in one line, exit 2, before any work (issue 67)."""

from __future__ import annotations

import json
import os

import pytest

from kvbench.methods.gatesight.paper import artifacts as A
from kvbench.methods.gatesight.paper.verdicts import CONTRADICTED, HELD, NOT_RESOLVED, PARTLY
from kvbench.results.store import ResultsStore
from tests.test_cli import kvbench  # the console entry point in-process

MAIN, SECOND = A.TINY_MODELS
N = 10  # contexts per task


def _row(model, grid, task, item, method, alloc, p, score):
    default = {"gatesight": "gate", "kvzip": "global"}.get(method, "flat")
    return {
        "model": model, "engine": "torch", "method": method, "allocation": alloc, "p": p, "bench": grid.bench,
        "task": task, "item": item, "question": "0", "length": 4096, "seed": 42, "context_sha256": f"{task}{item}",
        "model_fingerprint": model, "artifact_sha256": None, "real_fork": True, "score": score,
        "default_allocation": default, "scorer": "string_match_all",
    }  # fmt: skip


def _hits(rate: float):
    """Per context index: 100 for the first ``rate`` share of the N contexts, else 0 (paired across methods)."""
    return lambda i: 100.0 if i < round(rate * N) else 0.0


def made_up_rows(ties: bool = False) -> list[dict]:
    """Rows of the tiny plan's grids, each block driving one finding to one state (``ties``: instead, only the
    allocation grids, every allocation at 0, so that ``gate-at-least-flat-pyramid`` and ``gate-flat-pyramid-order``
    see ties at 0; the allocation grids share GateSight's gate rows with the method grids, hence two sets):

    * ``gs-leads-kvzip-p01`` held: at p = 0.1 GateSight hits 8 of 10 contexts per task, KVzip 2 (both models,
      both benches; a paired difference of +60 with 10 contexts per task);
    * ``gs-near-kvzip-high-p`` contradicted: at p = 0.9 / 0.8 / 0.7 GateSight 2 of 10, KVzip 8 (main model);
    * ``gs-beats-probe-free-every-p`` partly measured: of its 54 cases only (RULER, p = 0.5, snapkv) is measured
      (GateSight 8 of 10, SnapKV 1 of 10), and (RULER, p = 0.5, triattention) with TriAttention at 0 everywhere:
      the floor;
    * ``gs-most-accurate-p01`` partly measured: at p = 0.1 only KVzip of its four comparators has rows.
    """
    p = A.plan("tiny")
    g = {x.name: x for x in p.grids}
    rows = []

    def block(model, grid, method, alloc, ps, score):
        for task in grid.tasks:
            for i in range(N):
                rows.extend(_row(model, grid, task, i, method, alloc, q, score(i)) for q in ps)

    if ties:
        for grid in (g["alloc-ruler"], g["alloc-scbench"]):
            for alloc in A.ALLOCATIONS:
                block(MAIN, grid, "gatesight", alloc, list(A.ALL_P), _hits(0.0))
        return rows
    for model in (MAIN, SECOND):
        for grid in (g["main-ruler"], g["main-scbench"]):
            block(model, grid, "gatesight", "gate", [0.1], _hits(0.8))
            block(model, grid, "kvzip", "global", [0.1], _hits(0.2))
    for grid in (g["main-ruler"], g["main-scbench"]):
        block(MAIN, grid, "gatesight", "gate", [0.9, 0.8, 0.7], _hits(0.2))
        block(MAIN, grid, "kvzip", "global", [0.9, 0.8, 0.7], _hits(0.8))
    block(MAIN, g["main-ruler"], "gatesight", "gate", [0.5], _hits(0.8))
    block(MAIN, g["main-ruler"], "snapkv", "flat", [0.5], _hits(0.1))
    block(MAIN, g["main-ruler"], "triattention", "flat", [0.5], _hits(0.0))
    return rows


def _render(base, rows):
    store_dir = base / "rows"
    with ResultsStore(store_dir) as store:
        for r in rows:
            store.append(r)
    out = base / "page"
    assert kvbench("paper", "--results", str(store_dir), "--out", str(out)) == 0
    verdicts = json.loads((out / "verdicts.json").read_text(encoding="utf-8"))
    return out, {v["id"]: v for v in verdicts["verdicts"]}, (out / "paper.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return _render(tmp_path_factory.mktemp("paper-results"), made_up_rows())


@pytest.fixture(scope="module")
def ties(tmp_path_factory):
    return _render(tmp_path_factory.mktemp("paper-ties"), made_up_rows(ties=True))


def _comparisons(v):
    return [c for case in v["cases"] for c in case["comparisons"]]


def test_a_clear_win_with_enough_contexts_is_held(rendered):
    _, v, _ = rendered
    lead = v["gs-leads-kvzip-p01"]
    assert lead["status"] == HELD
    for c in _comparisons(lead):
        assert c["d"] == pytest.approx(60.0) and c["lo"] > 0 and c["units"] == N and c["state"] == HELD
        assert c["width"] == pytest.approx(c["hi"] - c["lo"]) and c["level"] == 0.95
    assert any(c["paper"] == pytest.approx(9.5) for c in _comparisons(lead))  # the paper's own difference beside


def test_a_clear_loss_is_contradicted(rendered):
    _, v, _ = rendered
    near = v["gs-near-kvzip-high-p"]
    assert near["status"] == CONTRADICTED
    assert all(c["hi"] < 0 and c["d"] == pytest.approx(-60.0 + 1.2) for c in _comparisons(near))


def test_ties_at_zero_are_not_resolved(ties):
    _, v, _ = ties
    for fid in ("gate-at-least-flat-pyramid", "gate-flat-pyramid-order"):
        assert v[fid]["status"] == NOT_RESOLVED, fid
        comps = _comparisons(v[fid])
        assert comps and all(c["d"] == 0 and c["lo"] == 0 == c["hi"] and c["state"] == NOT_RESOLVED for c in comps)


def test_one_case_of_54_is_partly_measured_and_the_floor_is_no_win(rendered):
    _, v, _ = rendered
    probe = v["gs-beats-probe-free-every-p"]
    assert probe["status"] == PARTLY and len(probe["cases"]) == 54
    measured = [c for c in probe["cases"] if c["comparisons"]]
    assert len(measured) == 2 and sum(c["state"] == HELD for c in measured) == 1  # snapkv at 0.5 on RULER
    floor = next(c for c in _comparisons(probe) if "triattention" in c["comparison"])
    assert floor["d"] > 0 and floor["lo"] > 0  # a "win" on its face ...
    assert floor["state"] == NOT_RESOLVED and floor["floor"].startswith("floor: triattention")  # ... that is none
    assert "52 of 54 cases not fully measured" in probe["note"]


def test_a_missing_comparator_is_partly_measured_and_named(rendered):
    _, v, _ = rendered
    most = v["gs-most-accurate-p01"]
    assert most["status"] == PARTLY
    for name in ("snapkv", "triattention", "keydiff"):
        assert any(m.startswith(f"{name} p=0.1, main-ruler") for m in most["comparators_missing"]), name
    assert any(m.startswith("kvzip p=0.1, main-ruler") for m in most["comparators_measured"])


def test_the_page_prints_rule_n_interval_and_width(rendered):
    _, _, md = rendered
    assert "**held** — " in md and "**contradicted** — " in md and "**partly measured** — " in md
    assert "Rule: every case (model in main/second, bench in scbench/ruler): left − right > 0" in md
    assert "paired bootstrap 95% interval" in md
    assert "10 contexts, 60 pairs" in md and "width " in md
    assert "floor: triattention" in md


def test_results_without_rows_is_refused(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert kvbench("paper", "--results", str(empty), "--out", str(tmp_path / "page")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no result" in err, err
    assert not (tmp_path / "page").exists()
    assert kvbench("paper", "--render-only", "--out", str(empty)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no result" in err and not list(empty.iterdir()), err


@pytest.mark.parametrize(
    "args, words",
    [
        (["--p", "0.1,0.1"], "repeats"),
        (["--p", ""], "empty entry"),
        (["--p", "1.5"], "outside 0 to 1"),
        (["--p", "x"], "not a number"),
        (["--threads", "0"], "--threads 0"),
        (["--threads", "-1"], "--threads -1"),
        (["--engine", "bogus"], "--engine 'bogus': give one of"),
        (["--lengths", "99999999"], "outside 64 to"),
        (["--lengths", "10"], "outside 64 to"),
        (["--lengths", "4k"], "not a number"),
        (["--limit", "0"], "--limit 0"),
        (["--repeats", "0"], "--repeats 0"),
        (["--scale", "huge"], "--scale 'huge'"),
        (["--corpus", "/nonexistent/corpus"], "--corpus"),
        (["--data-dir", "/nonexistent/data"], "--data-dir"),
        (["--dtype", "int3"], "--dtype"),
    ],
)
def test_every_argument_is_refused_in_one_line_before_any_work(tmp_path, capsys, args, words):
    out = tmp_path / "out"
    assert kvbench("paper", "--out", str(out), *args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err, err
    assert not out.exists()  # nothing written, no grid started


def test_out_under_an_unwritable_directory_is_one_line(capsys):
    """/proc refuses a new directory even to root: one line naming the path, no traceback."""
    assert kvbench("paper", "--out", "/proc/kvbench-paper/page", "--limit", "1") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "/proc/kvbench-paper" in err and "writable" in err, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a mode-555 directory; the /proc test covers root")
def test_out_under_a_read_only_directory_is_one_line(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert kvbench("paper", "--out", str(locked / "page"), "--limit", "1") == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(locked) in err and "writable" in err, err
        assert kvbench("paper", "--results", str(tmp_path), "--out", str(locked / "page")) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "writable" in err, err
    finally:
        locked.chmod(0o755)


def test_paper_scale_refuses_missing_data_then_missing_corpus_before_any_grid(tmp_path, capsys, monkeypatch):
    """At paper scale a run stops in one line before its first grid: first the bench data it cannot find (named,
    with the fetch command), then, with data in place, the missing --corpus; nothing is written."""
    monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
    monkeypatch.delenv("KVBENCH_SCBENCH_HUB", raising=False)
    out = tmp_path / "out"
    assert kvbench("paper", "--scale", "paper", "--model", "org/a", "--out", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ruler/squad.json (qa_1)" in err and "scbench repoqa, qa_eng" in err, err
    assert "kvbench data fetch all --data-dir DIR" in err and not out.exists()
    data = tmp_path / "data"
    for rel in ("ruler/PaulGrahamEssays.json", "ruler/squad.json", "ruler/hotpotqa.json"):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text("[]")
    for task in A.SCBENCH_TASKS:
        (data / "scbench" / f"scbench_{task}").mkdir(parents=True)
        (data / "scbench" / f"scbench_{task}" / "test.jsonl").write_text("{}\n")
    assert kvbench("paper", "--scale", "paper", "--model", "org/a", "--data-dir", str(data), "--out", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs --corpus DIR" in err and not out.exists(), err


def test_paper_scale_calibrates_the_hub_models_before_their_runs():
    p = A.plan("paper", ["org/a", "org/b"], corpus=True)
    names = [g.name for g in p.grids]
    for method in A.CALIBRATED:
        cal = names.index(f"calibrate-{method}")
        assert cal < names.index("main-ruler") and cal < names.index("alloc-ruler")
        assert next(g for g in p.grids if g.name == f"calibrate-{method}").models == "all"
    assert "calibrate-gatesight" in A.plan("paper", ["org/a"]).blocked  # without --corpus: listed, not run
    assert not [g for g in A.plan("tiny").grids if g.kind == "calibrate"]  # the shipped models carry theirs
