"""Report tables: means computed by hand, descending p columns, partial-mean marker, exclusions, warning."""

from rich.console import Console
from rich.table import Table

from kvbench.report import RANDOM_WARNING, render_markdown, render_rich, summarize, write_report

# (method, allocation, task, p) -> scores of its items; per-task means and means over tasks worked out below.
SCORES = {
    ("full", "none", "a", 1.0): [100, 0],  # 50.0
    ("full", "none", "a", 0.5): [100, 100],  # 100.0
    ("full", "none", "a", 0.1): [0],  # 0.0
    ("full", "none", "b", 1.0): [80],  # 80.0   -> mean over tasks 65.0
    ("full", "none", "b", 0.5): [60, 30],  # 45.0   -> 72.5
    ("full", "none", "b", 0.1): [20],  # 20.0   -> 10.0
    ("snapkv", "uniform", "a", 1.0): [90],  # -> 80.0
    ("snapkv", "uniform", "a", 0.5): [70],  # -> 60.0
    ("snapkv", "uniform", "a", 0.1): [40, 50],  # 45.0, task b lacks it -> 45.0*
    ("snapkv", "uniform", "b", 1.0): [70],
    ("snapkv", "uniform", "b", 0.5): [50],
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
    assert df.loc[("b", "full", 0.5), "n"] == 2
    assert ("b", "snapkv", 0.1) not in df.index  # only the fake fork had it
    assert len(df) == len(SCORES)


def test_per_task_tables_by_hand():
    md = render_markdown(make_rows())
    header = "| method [allocation] | p=1.0 | p=0.5 | p=0.1 |"
    assert table_lines(md, "a") == [
        header,
        "|---|---:|---:|---:|",
        "| full [none] | 50.0 | 100.0 | 0.0 |",
        "| snapkv [uniform] | 90.0 | 70.0 | 45.0 |",
    ]
    assert table_lines(md, "b")[2:] == [
        "| full [none] | 80.0 | 45.0 | 20.0 |",
        "| snapkv [uniform] | 70.0 | 50.0 |  |",
    ]
    assert "999" not in md
    assert f"{len(make_rows()) - 1} rows used (1 excluded" in md


def test_mean_over_tasks_marks_partial_cells():
    md = render_markdown(make_rows())
    assert table_lines(md, "mean over tasks")[2:] == [
        "| full [none] | 65.0 | 72.5 | 10.0 |",
        "| snapkv [uniform] | 80.0 | 60.0 | 45.0* |",
    ]
    assert "Cells marked * average fewer than the 2 tasks" in md


def test_random_weights_warning():
    assert RANDOM_WARNING not in render_markdown(make_rows())
    assert RANDOM_WARNING in render_markdown(make_rows(random_weights=True))


def test_no_partial_marker_when_complete():
    rows = [r for r in make_rows() if r["p"] != 0.1]
    md = render_markdown(rows)
    assert "*" not in md.replace(RANDOM_WARNING, "") and "Cells marked" not in md


def test_empty_and_excluded_only():
    assert "No results yet" in render_markdown([])
    assert render_rich([]) == []
    assert "No comparable results yet" in render_markdown(make_rows()[-1:])


def test_render_rich_and_write_report(tmp_path):
    tables = render_rich(make_rows(random_weights=True))
    assert len(tables) == 3 and all(isinstance(t, Table) for t in tables)
    console = Console(record=True, width=120)
    console.print(tables[0])
    text = console.export_text()
    assert "method [allocation]" in text and "snapkv [uniform]" in text and "Model weights are random" in text
    path = write_report(make_rows(), tmp_path / "reports" / "x" / "report.md")
    assert path.read_text(encoding="utf-8") == render_markdown(make_rows())
