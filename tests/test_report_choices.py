"""The report's CI reference and comparison method are settings: the defaults (gatesight, kvzip) when the rows
have them, otherwise a choice the report states; a method given but absent, or a setting without the chosen
method, is said in the notes, never a silently missing section."""

from __future__ import annotations

from kvbench.report import data as D
from kvbench.report import render as R
from kvbench.report import tables as T
from tests.test_report_views import DEFAULTS, row


def rows_of(scores: dict[str, float], items: int = 4, **kw) -> list[dict]:
    """Rows of each method at p = 0.5 on ``items`` contexts, the method's score on every one."""
    return [row(m, "t", i, 0, 0.5, s, **kw) for m, s in scores.items() for i in range(items)]


def avg_of(rows: list[dict]):
    return T.averaged(T.task_scores(D.usable(D.frame(rows))))


def blocks(report: R.Report, kind: str) -> list[R.Table]:
    return [b for sec in report.sections for b in sec.blocks if getattr(b, "kind", "") == kind]


def test_defaults_present_are_used_without_a_note():
    rows = rows_of({"gatesight": 60, "kvzip": 70, "snapkv": 50})
    assert R.choose_methods(avg_of(rows), R.Options(**DEFAULTS)) == ("gatesight", "kvzip", [])
    report = R.build(D.frame(rows), {}, [], [], R.Options(**DEFAULTS, n_resamples=100, figures=False))
    assert report.notes == [] and all("Notes" not in line for line in report.header)
    (ci,) = blocks(report, "ci")
    assert ci.title.startswith("Difference to gatesight [flat] with 95 % CI")
    (cmp,) = blocks(report, "comparison")
    assert cmp.title.startswith("Every method against KVzip — ") and cmp.name.startswith("kvzip-")
    assert "difference to KVzip (points)" in cmp.note and "kvzip" in cmp.data.columns


def test_without_the_defaults_the_report_states_its_choices():
    """No gatesight: the best mean over the pruned kept fractions is the CI reference; no kvzip: the
    comparison is against that reference; both choices are in the notes (and report.md)."""
    rows = rows_of({"snapkv": 50, "keydiff": 65, "random": 20}) + [row("full", "t", i, 0, 1.0, 90) for i in range(4)]
    ref, cmp, notes = R.choose_methods(avg_of(rows), R.Options(**DEFAULTS))
    assert (ref, cmp) == ("keydiff", "keydiff")
    assert notes == [
        "CI reference: keydiff, the best mean over the pruned kept fractions (the rows have no gatesight; "
        "--reference METHOD names another)",
        "comparison: keydiff, the CI reference (the rows have no kvzip; --compare METHOD names another)",
    ]
    report = R.build(D.frame(rows), {}, [], [], R.Options(**DEFAULTS, n_resamples=100, figures=False))
    assert report.notes == notes and report.header[-2:] == notes
    assert blocks(report, "ci") and blocks(report, "comparison")[0].title.startswith("Every method against KeyDiff")


def test_given_methods_win_and_an_absent_one_is_said():
    rows = rows_of({"gatesight": 60, "kvzip": 70, "snapkv": 50})
    ref, cmp, notes = R.choose_methods(avg_of(rows), R.Options(**DEFAULTS, reference="snapkv", compare="nowhere"))
    assert (ref, cmp) == ("snapkv", "nowhere")
    assert notes == ['comparison nowhere (--compare nowhere) has no rows here: no "Every method against" tables']
    opt = R.Options(**DEFAULTS, reference="snapkv", compare="nowhere", figures=False, n_resamples=100)
    report = R.build(D.frame(rows), {}, [], [], opt)
    assert not blocks(report, "comparison") and report.notes == notes
    assert blocks(report, "ci")[0].title.startswith("Difference to snapkv [flat]")


def test_no_ranked_method_at_all_is_said():
    rows = [row("full", "t", i, 0, 1.0, 90) for i in range(3)]
    ref, cmp, notes = R.choose_methods(avg_of(rows), R.Options(**DEFAULTS))
    assert (ref, cmp) == (None, None) and len(notes) == 2
    assert notes[0].startswith("CI reference: none, the rows have no gatesight")


def test_a_setting_without_the_chosen_method_is_named():
    """Two settings (seeds); gatesight and kvzip ran in one only: the other's missing views are in the notes."""
    rows = rows_of({"gatesight": 60, "kvzip": 70, "snapkv": 50})
    rows += [{**r, "seed": 7} for r in rows_of({"snapkv": 40, "random": 10})]
    report = R.build(D.frame(rows), {}, [], [], R.Options(**DEFAULTS, n_resamples=100, figures=False))
    assert len(blocks(report, "ci")) == 1 and len(blocks(report, "comparison")) == 1
    other = next(sec.title for sec in report.sections if "seed 7" in sec.title)
    assert report.notes == [
        f"{other}: no confidence intervals (no gatesight rows paired with another method's there)",
        f'{other}: no "Every method against KVzip" table (no kvzip rows there)',
    ]


def test_best_method_ranks_only_pruned_ranked_rows():
    rows = rows_of({"a": 50, "b": 50}) + [row("full", "t", i, 0, 1.0, 99) for i in range(4)]
    rows += [row("oracle", "t", i, 0, 0.5, 100, query_aware=True) for i in range(4)]
    assert T.best_method(avg_of(rows)) == "a"  # a tie goes to the first name; full and the ceiling never win
    assert T.best_method(avg_of([row("full", "t", 0, 0, 1.0, 99)])) is None


def test_comparison_column_never_shadows_another():
    rows = rows_of({"p": 30, "x": 50})  # a method named like a column
    avg = avg_of(rows)
    table = T.comparison_table(D.usable(D.frame(rows)), avg, "p").set_index("label")
    assert table.loc["x [flat]", "compared"] == 30 and table.loc["x [flat]", "delta"] == 20
    assert T.display_name("p") == "p" and T.display_name("kvzip") == "KVzip"
