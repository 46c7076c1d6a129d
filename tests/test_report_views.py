"""The report's views on synthetic rows with known answers: bootstrap CIs (against a brute-force loop), mixed-task
averaging, main-table marks, ablation differences, scorer sensitivity, KVzip and cost tables, the memory /
sessions arithmetic worked by hand, and the read-only loader."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pandas as pd
import pytest

from kvbench.errors import KvbenchError
from kvbench.report import data as D
from kvbench.report import render as R
from kvbench.report import tables as T
from kvbench.report.data import SETTING

#: the CI reference and comparison methods `kvbench report` passes as its defaults
DEFAULTS = {"default_reference": "gatesight", "default_compare": "kvzip"}

BASE = {
    "model": "m",
    "engine": "torch",
    "bench": "b",
    "seed": 42,
    "length": 1024,
    "real_fork": True,
    "context_sha256": "c0",
    "model_fingerprint": "f0",
    "artifact_sha256": None,
    "source": None,
}


def row(method, task, item, q, p, score, alloc="flat", **kw) -> dict:
    return {**BASE, "method": method, "allocation": alloc, "task": task, "item": str(item), "question": str(q),
            "p": p, "score": float(score), "scorer": kw.pop("scorer", "string_match_all"), **kw}  # fmt: skip


def ci_of(rows, reference="ref", n=2000):
    df = D.usable(D.frame(rows))
    return T.paired_bootstrap(df, reference, n_resamples=n, seed=1).set_index(["task", "label", "p"])


def test_identical_methods_ci_contains_zero_and_is_not_marked():
    rng = np.random.default_rng(0)
    rows = []
    for item in range(20):
        for q in range(3):
            s = float(rng.integers(0, 2) * 100)
            rows += [row("ref", "t", item, q, 0.5, s), row("same", "t", item, q, 0.5, s)]
            # zero-mean noise: +10 on even contexts, -10 on odd ones
            rows.append(row("noisy", "t", item, q, 0.5, s + (10 if item % 2 == 0 else -10)))
    ci = ci_of(rows)
    same = ci.loc[("t", "same [flat]", 0.5)]
    assert same["diff"] == 0 and same.lo <= 0 <= same.hi and not same.significant
    noisy = ci.loc[("t", "noisy [flat]", 0.5)]
    assert noisy["diff"] == pytest.approx(0) and noisy.lo < 0 < noisy.hi and not noisy.significant
    assert same.n_pairs == 60 and same.n_contexts == 20 and same.reference == "ref [flat]"


def test_better_on_every_item_gives_interval_above_zero():
    rows = []
    for item in range(12):
        for q in range(2):
            base = 10.0 * ((item * 7 + q) % 5)
            rows += [row("ref", "t", item, q, 0.3, base), row("better", "t", item, q, 0.3, base + 5 + item % 3)]
    ci = ci_of(rows).loc[("t", "better [flat]", 0.3)]
    assert ci.lo > 0 and ci.significant and 5 <= ci.lo <= ci["diff"] <= ci.hi <= 7


def test_bootstrap_matches_a_brute_force_loop_over_resamples():
    """Same resample draws, computed by materialising every resampled data set with pandas (incl. a mixed task)."""
    rng = np.random.default_rng(3)
    rows = []
    for item in range(7):
        for q in range(int(rng.integers(1, 4))):
            sub = "scbench_mix_a" if q % 2 == 0 else "scbench_mix_b"
            for m in ("ref", "x"):
                rows.append(row(m, "mix", item, q, 0.5, float(rng.integers(0, 101)), scorer=sub))
    b = 300
    got = T.paired_bootstrap(D.frame(rows), "ref", n_resamples=b, seed=5).iloc[0]
    key = ("m", "f0", "torch", "b", "1024", "42", "mix")
    w = T.resample_weights(7, b, (5, zlib.crc32("\x1f".join(key).encode())))
    df = pd.DataFrame(rows)
    pairs = df[df.method == "x"].merge(df[df.method == "ref"], on=["item", "question", "scorer"])
    pairs["d"] = pairs.score_x - pairs.score_y
    items = sorted(pairs["item"].unique())
    by_item = {it: list(zip(g.scorer, g.d, strict=True)) for it, g in pairs.groupby("item")}
    stats = []
    for counts in w:  # the resampled data set, written out context by context
        sample = [pair for it, c in zip(items, counts, strict=True) for _ in range(int(c)) for pair in by_item[it]]
        per_sub = [np.mean([d for s, d in sample if s == sub]) for sub in {s for s, _ in sample}]
        stats.append(np.mean(per_sub) if len(per_sub) == 2 else np.nan)
    lo, hi = np.nanpercentile(stats, [2.5, 97.5])
    point = pairs.groupby("scorer").d.mean().mean()
    assert got["diff"] == pytest.approx(point) and got.lo == pytest.approx(lo) and got.hi == pytest.approx(hi)


def test_ci_leaves_out_query_aware_full_and_fake_forks():
    rows = [row("ref", "t", i, 0, 0.5, 50) for i in range(5)]
    rows += [row("oracle", "t", i, 0, 0.5, 100, query_aware=True) for i in range(5)]
    rows += [row("full", "t", i, 0, 1.0, 100) for i in range(5)]
    rows += [row("fake", "t", i, 0, 0.5, 100, real_fork=False) for i in range(5)]
    assert ci_of(rows).empty
    assert T.paired_bootstrap(D.frame(rows), "absent").empty  # no reference: no intervals


def test_mixed_task_enters_as_mean_of_its_sub_tasks():
    rows = [row("snapkv", "repoqa_and_kv", i, 0, 0.5, 100, scorer="scbench_repoqa_and_kv_repoqa") for i in range(3)]
    rows.append(row("snapkv", "repoqa_and_kv", 0, 1, 0.5, 0, scorer="scbench_repoqa_and_kv_kv"))
    rows.append(row("snapkv", "kv", 0, 0, 0.5, 20, scorer="scbench_kv"))
    cells = T.task_scores(D.frame(rows)).set_index("task")
    assert cells.loc["repoqa_and_kv", "score"] == 50  # (100 + 0) / 2, not the row mean 75
    assert cells.loc["repoqa_and_kv", "n"] == 4
    avg = T.averaged(T.task_scores(D.frame(rows)))
    assert avg.score.tolist() == [35.0] and avg.n_tasks.tolist() == [2] and not avg.partial.any()


def _avg(values: dict) -> pd.DataFrame:
    """An averaged frame from {(method, allocation, p): score}, query-aware for method 'oracle'."""
    recs = [{**{k: str(v) for k, v in BASE.items() if k in SETTING}, "model_fingerprint": "", "label": f"{m} [{a}]",
             "method": m, "allocation": a, "p": p, "score": s, "n_tasks": 1, "n": 1, "partial": False,
             "query_aware": m == "oracle"} for (m, a, p), s in values.items()]  # fmt: skip
    return pd.DataFrame(recs)


def test_main_table_marks_the_best_ranked_method_only():
    avg = _avg({("full", "flat", 1.0): 90, ("a", "flat", 0.5): 60, ("b", "flat", 0.5): 70, ("a", "flat", 0.1): 40,
                ("b", "flat", 0.1): 40, ("oracle", "flat", 0.5): 99, ("oracle", "flat", 0.1): 99})  # fmt: skip
    t = T.main_table(avg).set_index("label")
    assert list(t.index) == ["full [flat]", "a [flat]", "b [flat]", "oracle [flat]"]
    assert list(t.columns[:3]) == ["p=1.0", "p=0.5", "p=0.1"]
    assert t.loc["b [flat]", "best"] == ["p=0.5", "p=0.1", "mean"] and t.loc["a [flat]", "best"] == ["p=0.1"]
    assert t.loc["oracle [flat]", "best"] == [] and t.loc["full [flat]", "best"] == []
    assert t.loc["a [flat]", "mean"] == 50 and np.isnan(t.loc["full [flat]", "mean"])
    gap = T.ceiling_gap(avg).set_index(["label", "p"]).gap
    assert gap[("a [flat]", 0.5)] == 39 and gap[("b [flat]", 0.1)] == 59 and ("full [flat]", 1.0) not in gap


def test_allocation_ablation_differences_to_the_default():
    avg = _avg(
        {
            ("gatesight", "gate", 0.5): 60,
            ("gatesight", "flat", 0.5): 55,
            ("gatesight", "pyramid", 0.5): 42,
            ("gatesight", "gate", 0.1): 30,
            ("gatesight", "flat", 0.1): 33,
            ("snapkv", "flat", 0.5): 50,
        }
    )
    ab = T.allocation_ablation(avg).set_index(["allocation", "p"])
    assert set(ab.index.get_level_values(0)) == {"gate", "flat", "pyramid"}  # snapkv ran one allocation only
    assert (ab.default == "gate").all()  # GateSight's own default allocation
    assert ab.delta[("flat", 0.5)] == -5 and ab.delta[("pyramid", 0.5)] == -18 and ab.delta[("flat", 0.1)] == 3
    assert ab.delta[("gate", 0.5)] == 0


def test_ablation_takes_the_recorded_default_and_never_a_stand_in():
    """A third-party method not installed where the report runs: its rows' recorded default allocation is the
    baseline; without one (rows of an older kvbench) no allocation is taken in its place: no differences, said
    so in the table's note."""
    cells = {("theirs", "pyramid", 0.5): 40, ("theirs", "flat", 0.5): 50}
    rows = [row(m, "t", 0, 0, p, s, alloc=a, default_allocation="pyramid") for (m, a, p), s in cells.items()]
    use = D.usable(D.frame(rows))
    avg = T.averaged(T.task_scores(use))
    ab = T.allocation_ablation(avg, T.recorded_defaults(use)).set_index("allocation")
    assert (ab.default == "pyramid").all() and ab.delta["flat"] == 10 and ab.delta["pyramid"] == 0
    older = T.allocation_ablation(
        avg,
        T.recorded_defaults(
            D.usable(D.frame([{k: v for k, v in r.items() if k != "default_allocation"} for r in rows]))
        ),
    ).set_index("allocation")
    assert (older.default == "").all() and older.delta.isna().all()  # not "flat" because it sorts first
    report = R.build(D.frame([{k: v for k, v in r.items() if k != "default_allocation"} for r in rows]), {}, [], [],
                     R.Options(**DEFAULTS, n_resamples=20, figures=False))  # fmt: skip
    table = next(b for sec in report.sections for b in sec.blocks if getattr(b, "kind", "") == "ablation")
    assert "No difference for theirs" in table.note and "(+" not in " ".join(table.shown.astype(str).sum())


def test_runner_rows_record_the_default_allocation(tmp_path, capsys):
    from tests.test_cli import kvbench, read_rows

    out = tmp_path / "o"
    args = ["run", "--model", "tiny-random", "--method", "test-keynorm", "--allocation", "flat", "--limit", "1"]
    args += ["--length", "600", "--p", "0.5", "--no-reference", "--out", str(out)]
    assert kvbench(*args) == 0, capsys.readouterr().err
    assert {r["default_allocation"] for r in read_rows(out)} == {"pyramid"}  # the class's, not the one run


def test_sessions_per_gpu_hand_worked():
    """16 attention layers x 4 KV heads x 256 dims x 2 bytes x (K, V) = 65,536 B per token; at 131,072 tokens a
    full session holds 8 GiB; kept ratio 0.5 -> 4 GiB; (141e9 - 54e9) / 2**32 = 20.26 -> 20 sessions."""
    shape = {"n_attn_layers": 16, "n_kv_heads": 4, "head_dim": 256, "dtype_bytes": 2, "weight_bytes": 54 * 10**9}
    rows = [row("snapkv", "t", i, 0, 0.5, 0, stored_bytes=500 + 100 * (i - 1), full_bytes=1000, n_context=10)
            for i in range(3)]  # ratios 0.4, 0.5, 0.6 -> mean 0.5  # fmt: skip
    mem = T.memory_view(D.frame(rows), {("m", "f0"): shape}, T.parse_bytes("141GB"), 131072).iloc[0]
    assert mem.full_per_token == 65536 and mem.measured_per_token == 100
    assert mem.kept_ratio == pytest.approx(0.5) and mem.session_bytes == pytest.approx(2**32)
    assert mem.sessions == 20
    unknown = T.memory_view(D.frame(rows), {}, 10**9, 1000).iloc[0]
    assert unknown.full_per_token == 100 and np.isnan(unknown.sessions)  # no shape: measured bytes, no weights


def test_parse_bytes():
    assert T.parse_bytes("141GB") == 141 * 10**9 and T.parse_bytes("80 GiB") == 80 * 2**30
    assert T.parse_bytes("1e9") == 10**9
    with pytest.raises(ValueError):
        T.parse_bytes("lots")


def test_scorer_sensitivity_per_task_means_and_order():
    rows = []
    for m, (off, rev) in {"a": (80, 40), "b": (60, 70)}.items():
        for i in range(2):
            rows.append(row(m, "qa_chn", i, 0, 0.5, off, scorer="scbench_qa_chn",
                            scores={"scbench_qa_chn": off, "scbench_qa_chn_revised": rev}))  # fmt: skip
            rows.append(row(m, "kv", i, 0, 0.5, 50, scorer="scbench_kv",
                            scores={"scbench_kv": 50, "scbench_kv_revised": 50}))  # fmt: skip
    s = T.scorer_sensitivity(D.frame(rows))
    per = s["per_task"].set_index("label")
    assert set(s["per_task"].task) == {"qa_chn"}  # kv's revision is the same function
    assert per.loc["a [flat]", "delta"] == -40 and per.loc["b [flat]", "score_revised"] == 70
    means = s["means"].set_index("label")
    assert means.loc["a [flat]", "score_official"] == 65 and means.loc["a [flat]", "score_revised"] == 45
    order = s["order"].iloc[0]
    assert order.order_official == ("a [flat]", "b [flat]") and order.order_revised == ("b [flat]", "a [flat]")
    assert not order.same
    assert T.scorer_sensitivity(D.frame([row("a", "t", 0, 0, 0.5, 1)]))["per_task"].empty


def test_comparison_table_deltas_and_timing():
    rows = []
    for i in range(3):
        rows.append(row("kvzip", "t", i, 0, 0.5, 60, alloc="global", score_s=2.0 + i, prefill_s=1.0))
        rows.append(row("gatesight", "t", i, 0, 0.5, 50, alloc="gate", score_s=0.01, prefill_s=1.0))
    df = D.frame(rows)
    kz = T.comparison_table(df, T.averaged(T.task_scores(df)), "kvzip").set_index("label")
    assert kz.loc["gatesight [gate]", "delta"] == -10 and kz.loc["kvzip [global]", "delta"] == 0
    assert kz.loc["gatesight [gate]", "kvzip"] == 60  # the compared method's score, in a column of its name
    assert kz.loc["kvzip [global]", "score_s"] == 3.0 and kz.loc["kvzip [global]", "score_over_prefill"] == 3.0


def test_cost_table_from_cost_json():
    cost = {
        "meta": {},
        "rows": [
            {"method": "snapkv", "length": 16384, "prefill_s": 2.0, "score_s": 0.5},
            {"method": "snapkv", "length": 4096, "prefill_s": 1.0, "score_s": 0.1},
        ],
    }
    t = T.cost_table(cost)
    assert t.length.tolist() == [4096, 16384] and t.ratio.tolist() == [0.1, 0.25]


def test_load_merges_shards_skips_a_torn_last_line_and_never_writes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    r0, r1, r2 = (row("snapkv", "t", i, 0, 0.5, 10 * i) for i in range(3))
    (a / "results.jsonl").write_text(json.dumps(r0) + "\n")
    (a / "results.shard-1-of-2.jsonl").write_text(json.dumps(r1) + "\n" + json.dumps(r2)[:20])
    (b / "results.jsonl").write_text(json.dumps(r0) + "\n" + json.dumps(r2) + "\n")
    (b / "missing.json").write_text(json.dumps({"b/absent": "absent.json not found"}))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    df, missing, notes = D.load([a, b])
    assert sorted(df["item"].astype(str)) == ["0", "1", "2"]  # r0 twice -> once
    assert missing == {"b/absent": "absent.json not found"}
    assert any("incomplete last line" in n and "shard-1-of-2" in n for n in notes)
    assert any("1 rows stored more than once" in n for n in notes)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    (a / "results.jsonl").write_text("{not json\n" + json.dumps(r0) + "\n")
    with pytest.raises(KvbenchError, match="line 1 is not a valid result row"):
        D.load(a)
    with pytest.raises(KvbenchError, match="no results (in|directory)"):
        D.load(tmp_path / "empty")


def test_frame_defaults_and_labels():
    df = D.frame([{"model": "m", "method": "tri[zero_freq_bands=false]", "allocation": "flat", "p": 0.5, "score": 1,
                   "task": "t",
                   "method_options": {"zero_freq_bands": False}, "scorer": "scbench_qa_chn_revised",
                   "scores": {"scbench_qa_chn": 7, "scbench_qa_chn_revised": 1}}])  # fmt: skip
    r = df.iloc[0]
    assert r.label == "tri[zero_freq_bands=false] [flat]" and r.length == "n/a" and r.seed == "n/a"
    assert r.score_official == 7 and r.score_revised == 1 and r.real_fork and not r.query_aware


def test_loads_row_reads_every_line_as_the_standard_library_does():
    """msgspec's strict decoder first, json.loads for what it refuses: the same value, or a ValueError."""
    import json
    import math

    from kvbench.results.keys import loads_row

    lines = [b'{"a": 1, "b": [1.5, -0.0, "x"], "c": {"d": null}}', b'{"a": 123456789012345678901234567890}',
             b'{"a": 1, "a": 2}', b'{"a": NaN}', b'{"a": Infinity}', b'{"a": 1e400}', b'{"a": "\\ud800"}',
             b'\xef\xbb\xbf{"a": 1}', b"[1, 2]", b'  {"a": 1}  \n']  # fmt: skip
    for line in lines:
        got, want = loads_row(line), json.loads(line)
        assert repr(got) == repr(want) or (math.isnan(got["a"]) and math.isnan(want["a"])), line
    for bad in (b'{"a": 1', b'{"a": "\xff"}', b"", b"{'a': 1}"):
        with pytest.raises(ValueError):
            loads_row(bad)


def test_load_equals_frame_of_read_results(tmp_path, monkeypatch):
    """``load`` (keyed fast path: identity columns from the reader's interned keys) gives exactly the frame of
    the rows ``read_results`` returns, over what readers must handle: two shards with an overlapping row,
    legacy rows, null and non-str key fields, mixed-task scorers with revisions, absent optional fields and a
    cut last line."""
    import json

    from kvbench.report.data import frame, load
    from kvbench.results.read import read_results
    from tests.test_results import make_row

    rows = [
        make_row(0, task="repoqa_and_kv", scorer="scbench_repoqa_and_kv_kv", score=100.0,
                 scores={"scbench_repoqa_and_kv_kv": 100.0, "scbench_repoqa_and_kv_kv_revised": 0.0}),
        make_row(1, p=0.30000000000000004, seed=None, model_fingerprint=None, real_fork=False, stored_bytes=10),
        make_row(2, item=7, question=3, length=4096, scorer="x_revised", scores={"x": 50.0}, score=25.0),
        make_row(3, method="gatesight[window=8]", allocation="gate", query_aware=True, random_weights=True),
    ]  # fmt: skip
    legacy = {k: v for k, v in make_row(9).items() if k not in ("length", "seed")}
    # lines msgspec's strict decoder refuses and the standard library reads: NaN, a lone surrogate
    odd = [json.dumps(make_row(11, score=float("nan"))), json.dumps(make_row(12, prediction="\ud800"))]
    d = tmp_path / "run"
    d.mkdir()
    (d / "results.shard-0-of-2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [rows[0], legacy, rows[1]]))
    (d / "results.shard-1-of-2.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [rows[1], rows[2], rows[3]])
        + "\n".join(odd)
        + "\n"
        + json.dumps(make_row(5))[:-3]
    )
    df, missing, notes = load(d)
    expected = frame(read_results(d).rows)
    pd.testing.assert_frame_equal(df, expected)
    for workers in (1, 3):  # spans of a few lines each, parsed here and by a pool: the same frame and notes
        monkeypatch.setattr("kvbench.report.data.SPAN_BYTES", 300)
        again, _, again_notes = load(d, workers=workers)
        pd.testing.assert_frame_equal(again, expected)
        assert again_notes == notes
    assert len(df) == 6 and missing == {} and np.isnan(df.score.iloc[4])
    assert any("incomplete last line" in n for n in notes) and any("older kvbench" in n for n in notes)
    assert any("counted once" in n for n in notes)
    assert list(df.seed.astype(str)) == ["42", "None", "42", "42", "42", "42"]
    assert df.model_fingerprint.iloc[1] == "None"
    assert list(df["item"].astype(str)) == ["0", "1", "7", "3", "11", "12"] and df.question.iloc[2] == "3"
    assert list(df["sub"].astype(str)) == ["kv", "", "", "", "", ""] and df.score_revised.iloc[0] == 0.0
    assert df.score_official.iloc[2] == 50.0 and df.p.iloc[1] == 0.3


def test_ceiling_note_explains_a_negative_gap_only_when_there_is_one():
    """The oracle targets the full-cache answer: a method can beat it (a pruned cache that fixed an answer)."""
    below = T.ceiling_gap(_avg({("a", "flat", 0.5): 60, ("oracle", "gate", 0.5): 70}))
    above = T.ceiling_gap(_avg({("a", "flat", 0.5): 60, ("b", "flat", 0.5): 75, ("oracle", "gate", 0.5): 70}))
    assert below.gap.tolist() == [10] and sorted(above.gap.tolist()) == [-5, 10]
    assert R._ceiling_note(below) == "Ceiling minus method, points (mean over tasks)."
    assert "A negative gap: the method scored above the ceiling" in R._ceiling_note(above)
