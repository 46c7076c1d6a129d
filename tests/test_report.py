"""Report tables: means and differences from no prune computed by hand, descending p columns, the compact
table, partial-mean marker, exclusions, warning, missing data grouped by reason."""

from rich.console import Console
from rich.table import Table

from kvbench.report import RANDOM_WARNING, missing_lines, render_markdown, render_rich, summarize, write_report
from kvbench.report.terminal import FIX_SEPARATOR, Heading

# (method, allocation, task, p) -> scores of its items; per-task means and means over tasks worked out below.
SCORES = {
    ("full", "flat", "a", 1.0): [100, 0],  # 50.0
    ("full", "flat", "b", 1.0): [80],  # 80.0   -> mean over tasks 65.0
    ("snapkv", "uniform", "a", 0.5): [70],  # 70.0, +20.0 from no prune
    ("snapkv", "uniform", "a", 0.1): [40, 50],  # 45.0, -5.0; task b lacks it -> mean 45.0*, -5.0*
    ("snapkv", "uniform", "b", 0.5): [50],  # 50.0, -30.0 -> mean 60.0, -5.0
}


def make_rows(random_weights: bool = False) -> list[dict]:
    """Rows for SCORES plus one fake-fork row that must not enter the tables."""
    rows = [
        {"model": "m", "engine": "e", "bench": "bench1", "task": task, "method": method, "allocation": alloc,
         "p": p, "item": i, "question": "q", "score": float(s), "random_weights": random_weights}
        for (method, alloc, task, p), scores in SCORES.items()
        for i, s in enumerate(scores)
    ]  # fmt: skip
    fake = {**rows[-1], "task": "b", "p": 0.1, "score": 999.0, "real_fork": False}
    return [*rows, fake]


def table_lines(md: str, title: str) -> list[str]:
    """The markdown table lines under the ``### title`` heading."""
    section = md.split(f"### {title}\n\n", 1)[1]
    return [line for line in section.split("\n\n", 1)[0].splitlines() if line.startswith("|")]


def test_summarize_means_counts_and_exclusion():
    df = summarize(make_rows()).set_index(["task", "method", "p"])
    assert df.loc[("a", "full", 1.0), "score"] == 50.0
    assert df.loc[("a", "full", 1.0), "n"] == 2
    assert ("b", "snapkv", 0.1) not in df.index  # only the fake fork had it
    assert len(df) == len(SCORES)


def test_per_task_tables_by_hand():
    """No prune leads every table (its score in each p column), each method is followed by its difference."""
    md = render_markdown(make_rows())
    header = "| method [allocation] | p=0.5 | p=0.1 |"
    assert table_lines(md, "a") == [
        header,
        "|---|---:|---:|",
        "| no prune (full) | 50.0 | 50.0 |",
        "| snapkv [uniform] | 70.0 | 45.0 |",
        "|   vs no prune | +20.0 | -5.0 |",
    ]
    assert table_lines(md, "b")[2:] == [
        "| no prune (full) | 80.0 | 80.0 |",
        "| snapkv [uniform] | 50.0 |  |",
        "|   vs no prune | -30.0 |  |",
    ]
    assert "999" not in md
    assert f"{len(make_rows()) - 1} rows used (1 excluded" in md


def test_mean_over_tasks_marks_partial_cells():
    md = render_markdown(make_rows())
    assert table_lines(md, "mean over tasks")[2:] == [
        "| no prune (full) | 65.0 | 65.0 |",
        "| snapkv [uniform] | 60.0 | 45.0* |",
        "|   vs no prune | -5.0 | -5.0* |",
    ]
    assert "*: a mean over fewer than the 2 tasks of bench1" in md


def test_one_method_at_one_p_is_one_compact_table():
    rows = [r for r in make_rows() if r["p"] != 0.1]
    md = render_markdown(rows)
    assert "### a" not in md and "### mean over tasks" not in md
    assert table_lines(md, "per task") == [
        "| task | no prune | snapkv [uniform] p=0.5 | vs no prune |",
        "|---|---:|---:|---:|",
        "| a | 50.0 | 70.0 | +20.0 |",
        "| b | 80.0 | 50.0 | -30.0 |",
        "| mean | 65.0 | 60.0 | -5.0 |",
    ]


def test_a_setting_with_only_no_prune_rows_says_so():
    md = render_markdown([r for r in make_rows() if r["method"] == "full"])
    assert "Only no-prune rows (full) here, nothing to compare: a 50.0, b 80.0. Add a method: --method NAME." in md
    assert "|" not in md


def test_rows_without_the_reference_name_the_flag():
    md = render_markdown([r for r in make_rows() if r["method"] != "full"])
    assert "no prune" not in md and "| snapkv [uniform] | 70.0 | 45.0 |" in md  # no no-prune row or difference
    assert "No no-prune rows for m, bench1, length n/a, seed n/a: rerun without --no-reference (rows there" in md
    assert "--no-reference" not in render_markdown(make_rows())


def test_missing_data_is_said_once_per_reason():
    fix = "put the hub dataset under DIR/scbench and pass --data-dir DIR"
    missing = {f"bench1/{t}": f"needs the hub data{FIX_SEPARATOR}{fix}" for t in ("x", "y", "z")}
    missing["bench1/w"] = "w.json not found"
    missing["bench1/a"] = f"needs the hub data{FIX_SEPARATOR}{fix}"  # a has rows: not missing
    lines = missing_lines(make_rows(), missing)
    assert lines == [
        "- **bench1/w** missing: w.json not found",
        "- **bench1/x, y, z (3 tasks)** missing: needs the hub data",
        f"- to run them: {fix}",
    ]


def test_random_weights_warning():
    assert RANDOM_WARNING not in render_markdown(make_rows())
    assert RANDOM_WARNING in render_markdown(make_rows(random_weights=True))


def test_no_partial_marker_when_complete():
    rows = [r for r in make_rows() if r["p"] != 0.1]
    md = render_markdown(rows)
    assert "*" not in md.replace(RANDOM_WARNING, "") and "fewer than" not in md


def test_empty_and_excluded_only():
    assert "No results yet" in render_markdown([])
    assert render_rich([]) == []
    assert "No comparable results yet" in render_markdown(make_rows()[-1:])


def test_render_rich_and_write_report(tmp_path):
    out = render_rich(make_rows(random_weights=True))
    tables = [t for t in out if isinstance(t, Table)]
    assert [t.title for t in tables] == ["a", "b", "mean over tasks"]
    headings = [h for h in out if isinstance(h, Heading)]
    assert len(headings) == 1 and headings[0].parts == ("m", "e", "bench1", "length n/a", "seed n/a")
    console = Console(record=True, width=120)
    for item in out:
        console.print(item)
    text = console.export_text()
    assert "method [allocation]" in text and "snapkv [uniform]" in text and "Model weights are random" in text
    assert text.index("no prune (full)") < text.index("snapkv [uniform]")
    path = write_report(make_rows(), tmp_path / "reports" / "x" / "report.md")
    assert path.read_text(encoding="utf-8") == render_markdown(make_rows())
