"""The report's across-models views: each method's mean over the tasks every model has and its rank, per model
and p, and Kendall's tau-b between the models' orders; checked against hand-worked values and the definition."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from kvbench.report import data as D
from kvbench.report import render as R
from kvbench.report import tables as T
from tests.test_report_views import DEFAULTS, row


def tau_by_definition(x, y) -> float:
    """Kendall's tau-b straight from its definition: (concordant - discordant) / sqrt((n0 - tx)(n0 - ty))."""
    pairs = list(itertools.combinations(range(len(x)), 2))
    s = sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i, j in pairs)
    n0 = len(pairs)
    tx = sum(1 for i, j in pairs if x[i] == x[j])
    ty = sum(1 for i, j in pairs if y[i] == y[j])
    denom = math.sqrt((n0 - tx) * (n0 - ty))
    return s / denom if denom else math.nan


def test_kendall_tau_b_hand_worked():
    assert T.kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)  # 5 concordant, 1 discordant
    assert T.kendall_tau_b([1, 1, 2, 3], [1, 2, 2, 3]) == pytest.approx(4 / 5)  # one tie in each: sqrt(5 * 5)
    assert T.kendall_tau_b([1, 2, 3], [3, 2, 1]) == -1.0
    assert math.isnan(T.kendall_tau_b([2, 2, 2], [1, 2, 3])) and math.isnan(T.kendall_tau_b([1], [1]))
    with pytest.raises(ValueError):
        T.kendall_tau_b([1, 2], [1])


def test_kendall_tau_b_equals_its_definition():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 9))
        x, y = rng.integers(0, 4, n).astype(float), rng.integers(0, 4, n).astype(float)  # many ties
        want = tau_by_definition(x, y)
        got = T.kendall_tau_b(x, y)
        assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want), (x, y)


def _two_models() -> list[dict]:
    """Model a: tasks t1, t2; model b: t1, t2, t3 (t3 is not common). One item, one question per cell."""
    scores = {  # (model, task) -> {method: score at p=0.5}
        ("a", "t1"): {"x": 80, "y": 60, "z": 40, "oracle": 100},
        ("a", "t2"): {"x": 60, "y": 40, "z": 20, "oracle": 100},
        ("b", "t1"): {"x": 70, "y": 90, "z": 10, "oracle": 100},
        ("b", "t2"): {"x": 50, "y": 70, "z": 30, "oracle": 100},
        ("b", "t3"): {"x": 0, "y": 0, "z": 100, "oracle": 100},
    }
    rows = []
    for (model, task), by_method in scores.items():
        fp = f"fp-{model}"
        rows.append(row("full", task, 0, 0, 1.0, 90, model=model, model_fingerprint=fp))
        for method, s in by_method.items():
            aware = method == "oracle"
            rows.append(row(method, task, 0, 0, 0.5, s, model=model, model_fingerprint=fp, query_aware=aware))
    rows.append(row("w", "t1", 0, 0, 0.5, 100, model="a", model_fingerprint="fp-a"))  # lacks t2 on a
    return rows


def test_across_models_means_over_common_tasks_and_ranks():
    cells = T.task_scores(D.usable(D.frame(_two_models())))
    across = T.across_models(cells)
    got = across.set_index(["model", "label", "p"])
    assert set(across.n_tasks) == {2}  # t3 is only on model b: left out of both means
    assert got.loc[("a", "x [flat]", 0.5), "score"] == 70 and got.loc[("b", "x [flat]", 0.5), "score"] == 60
    assert got.loc[("b", "z [flat]", 0.5), "score"] == 20  # t3's 100 does not enter
    assert [got.loc[("a", f"{m} [flat]", 0.5), "rank"] for m in "xyz"] == [1, 2, 3]
    assert [got.loc[("b", f"{m} [flat]", 0.5), "rank"] for m in "xyz"] == [2, 1, 3]
    assert not got.loc[("a", "w [flat]", 0.5), "complete"] and math.isnan(got.loc[("a", "w [flat]", 0.5), "rank"])
    for unranked in ("full [flat]", "oracle [flat]"):
        assert across[across.label == unranked]["rank"].isna().all()
    agree = T.rank_agreement(across)
    assert len(agree) == 1 and agree.n.iloc[0] == 3  # x, y, z: w is not complete on a
    assert agree.tau.iloc[0] == pytest.approx(T.kendall_tau_b([70, 50, 30], [60, 80, 20]))  # = 1/3
    assert agree.tau.iloc[0] == pytest.approx(1 / 3)


def test_one_model_has_no_across_view():
    rows = [r for r in _two_models() if r["model"] == "a"]
    cells = T.task_scores(D.usable(D.frame(rows)))
    assert T.across_models(cells).empty and T.rank_agreement(T.across_models(cells)).empty


def test_two_weights_of_one_name_are_told_apart():
    rows = _two_models()
    for r in rows:
        r["model"] = "same"
    cells = T.task_scores(D.usable(D.frame(rows)))
    agree = T.rank_agreement(T.across_models(cells))
    assert (agree.model_a.iloc[0], agree.model_b.iloc[0]) == ("same@fp-a", "same@fp-b")


def test_report_has_the_across_models_section(tmp_path):
    df = D.frame(_two_models())
    report = R.build(df, {}, [], [], R.Options(**DEFAULTS, n_resamples=50, figures=False))
    across = [s for s in report.sections if s.title.startswith("Across models")]
    assert len(across) == 1 and across[0].title == "Across models — torch · b · length 1024 · seed 42"
    table, agreement = across[0].blocks

    shown = table.shown.set_index("method [allocation]")
    assert shown.loc["x [flat]", "a p=0.5"] == "70.0 (#1)" and shown.loc["y [flat]", "b p=0.5"] == "80.0 (#1)"
    assert shown.loc["w [flat]", "a p=0.5"] == "100.0*" and shown.loc["oracle [flat]", "a p=0.5"] == "100.0"
    assert list(shown.index[:1]) == ["full [flat]"] and shown.index[-1] == "oracle [flat]"
    assert agreement.shown.iloc[0].tolist() == ["p=0.5", "+0.33 (n=3)"]
    R.write(report, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.count("Across models (mean over 2 common tasks)") == 1 and md.count("+0.33 (n=3)") == 1
    assert (tmp_path / "rep" / "tables" / "agreement-torch-b-1024-42.csv").is_file()


def test_terminal_tables_include_the_across_models_view():
    from rich.table import Table

    from kvbench.report.terminal import Heading, render_markdown, render_rich

    out = render_rich(_two_models())
    across = next(i for i, h in enumerate(out) if isinstance(h, Heading) and h.parts[0] == "Across models")
    assert out[across].parts == ("Across models", "torch", "b", "length 1024", "seed 42")
    titles = [t.title for t in out[across:] if isinstance(t, Table)]
    assert titles == ["mean over 2 common tasks", "rank agreement"]
    assert "Across models" not in render_markdown(_two_models(), across=False)


def _lines(ax) -> dict[str, tuple[list[float], list[float]]]:
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}


def test_across_figure_draws_each_model_over_the_common_tasks():
    from kvbench.report import figures as F

    across = T.across_models(T.task_scores(D.usable(D.frame(_two_models()))))
    names = T.model_names(across)
    fig = F.across_curves(across, names, "t", F.colors(sorted(set(across.label))))
    a, b = [ax for ax in fig.axes if ax.get_visible()]
    assert (a.get_title(), b.get_title()) == ("a", "b")
    la, lb = _lines(a), _lines(b)
    # hand-worked means over t1, t2 (t3 is only on b): a x=(80+60)/2, b x=(70+50)/2, b z=(10+30)/2
    assert la["x [flat]"] == ([0.5], [70.0]) and lb["x [flat]"] == ([0.5], [60.0]) and lb["z [flat]"][1] == [20.0]
    assert "w [flat]" not in la  # lacks t2 on a: its mean would be over t1 alone
    assert la["no prune (full)"][1] == [90.0, 90.0]  # the horizontal no-prune line
    oracle = next(ln for ln in a.get_lines() if ln.get_label().startswith("oracle"))
    assert oracle.get_linestyle() == "--" and list(oracle.get_ydata()) == [100.0]


def test_report_draws_the_across_models_figure(tmp_path):
    report = R.build(D.frame(_two_models()), {}, [], [], R.Options(**DEFAULTS, n_resamples=20))
    (sec,) = [s for s in report.sections if s.title.startswith("Across models")]
    fig = sec.blocks[0]
    assert isinstance(fig, R.Figure) and fig.name == "models-torch-b-1024-42" and fig.png[:4] == b"\x89PNG"
    R.write(report, tmp_path / "rep")
    assert (tmp_path / "rep" / "figures" / "models-torch-b-1024-42.pdf").is_file()
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "![Side by side across models](figures/models-torch-b-1024-42.png)" in md


def test_across_models_weighs_each_task_once_whatever_its_rows():
    """The mean over tasks gives every task the same weight: t1 has one row scoring 0, t2 three rows scoring 100,
    so each model's mean is (0 + 100) / 2 = 50 (weighted by rows it would be 75)."""
    rows = []
    for model in ("a", "b"):
        fp = f"fp-{model}"
        rows.append(row("x", "t1", 0, 0, 0.5, 0, model=model, model_fingerprint=fp))
        rows += [row("x", "t2", item, 0, 0.5, 100, model=model, model_fingerprint=fp) for item in range(3)]
    across = T.across_models(T.task_scores(D.usable(D.frame(rows))))
    assert list(across.score) == [50.0, 50.0] and set(across.n_tasks) == {2}
