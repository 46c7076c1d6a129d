"""The terminal report of the headline command (`kvbench run --method gatesight --bench scbench --p 0.1`, which adds
the no-prune reference; SCBench offline: kv, mf, prefix_suffix and vt generated, the hub tasks missing their data)
at 80, 100 and 150 columns: one heading per setting, one compact table with no prune first, titles that never
wrap, the missing data said once, and notes only where a flag acts."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvbench.report import tables as T
from kvbench.report.data import frame, usable
from kvbench.report.terminal import Heading, choice_notes, missing_lines, print_report, render_rich

FINGERPRINT = "982bbbf2da78" + "ab" * 26
GENERATED = {"kv": (40.0, 0.0), "mf": (20.0, 0.0), "prefix_suffix": (10.0, 0.0), "vt": (30.0, 4.2)}  # no prune, gs


def headline_rows(ps: tuple[float, ...] = (0.1,)) -> list[dict]:
    """Two items per generated task: method full at p = 1.0 and gatesight [gate] at each of ``ps``."""
    rows = []
    for task, (full, gatesight) in GENERATED.items():
        for item in ("0", "1"):
            base = {"model": "tiny-trained", "model_fingerprint": FINGERPRINT, "engine": "torch", "bench": "scbench",
                    "source": "generated", "length": 1024, "seed": 42, "task": task, "item": item,
                    "question": "q"}  # fmt: skip
            rows.append({**base, "method": "full", "allocation": "flat", "p": 1.0, "score": full})
            rows += [{**base, "method": "gatesight", "allocation": "gate", "p": p, "score": gatesight} for p in ps]
    return rows


def hub_missing() -> dict[str, str]:
    """``missing.json`` of the headline run: every hub-only SCBench task, as the run records it."""
    from kvbench.tasks import get_bench
    from kvbench.tasks.scbench import _missing

    hub = [t for t in get_bench("scbench").tasks() if t not in GENERATED]
    return {f"scbench/{t}": str(_missing(t, None, generated_mode=True)) for t in hub}


def printed(rows: list[dict], width: int) -> list[str]:
    """The report's lines as a ``width``-column console prints them."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    print_report(console, render_rich(rows))
    return console.export_text().splitlines()


def _row(lines: list[str], first: str) -> list[str]:
    """The cells of the table line whose first cell is ``first``."""
    for line in lines:
        cells = [c.strip() for c in line.strip("│┃ ").replace("┃", "│").split("│")]
        if cells[0] == first:
            return cells
    raise AssertionError(f"no table line starts with {first!r}")


@pytest.mark.parametrize("width", [80, 100, 150])
def test_headline_report_is_one_compact_table_with_no_prune_first(width):
    rows = headline_rows()
    out = render_rich(rows)
    tables = [t for t in out if isinstance(t, Table)]
    headings = [h for h in out if isinstance(h, Heading)]
    assert len(tables) == 1 and len(headings) == 1
    lines = printed(rows, width)
    assert max(map(len, lines)) <= width  # nothing is wider than the console

    heading = " · ".join(headings[0].parts)
    assert heading == "tiny-trained (982bbbf2da78) · torch · SCBench (generated offline) · length 1024 · seed 42"
    if width >= 100:
        assert heading in [line.strip() for line in lines]  # one line
    else:  # broken between two parts, never inside one
        broken = [line.strip() for line in lines[lines.index("") + 1 :][:2]]
        assert " · ".join(broken) == heading
    titles = [line.strip() for line in lines if line.strip() == "per task"]
    assert titles == ["per task"]  # the short title, on one line of its own

    assert _row(lines, "task") == ["task", "no prune", "gatesight [gate] p=0.1", "vs no prune"]
    assert _row(lines, "vt") == ["vt", "30.0", "4.2", "-25.8"]
    assert _row(lines, "mean") == ["mean", "25.0", "1.1", "-23.9"]


@pytest.mark.parametrize("width", [80, 100, 150])
def test_several_ps_lead_every_table_with_the_no_prune_row(width):
    rows = headline_rows(ps=(0.5, 0.1))
    lines = printed(rows, width)
    tables = [t for t in render_rich(rows) if isinstance(t, Table)]
    assert [t.title for t in tables] == ["kv", "mf", "prefix_suffix", "vt", "mean over tasks"]
    for t in tables:
        assert t.columns[0]._cells[0] == "no prune (full)"  # the first row of every table
        assert t.columns[0]._cells[1:] == [escape("gatesight [gate]"), "  vs no prune"]
        assert t.title in [line.strip() for line in lines]  # every title on one line of its own
    if width >= 100:
        assert max(map(len, lines)) <= width
    assert _row(lines, "method [allocation]") == ["method [allocation]", "p=0.5", "p=0.1"]


def test_headline_missing_data_is_said_once():
    missing = hub_missing()
    lines = missing_lines(headline_rows(), missing)
    assert len(lines) == 2  # one reason for the eight hub tasks, one fix
    assert lines[0].startswith("- **scbench/") and f"({len(missing)} tasks)** missing: needs SCBench's hub" in lines[0]
    assert lines[1].startswith("- to run them: ") and "kvbench data fetch scbench --data-dir DIR" in lines[1]
    assert sum("--data-dir" in line for line in lines) == 1


def test_headline_notes_name_the_flag_that_acts():
    avg = T.averaged(T.task_scores(usable(frame(headline_rows()))))
    notes = choice_notes(avg, "gatesight", "gatesight", defaults=("gatesight", "kvzip"))
    assert len(notes) == 1 and "--method gatesight," in notes[0]
    assert not any("CI reference" in n or "no kvzip" in n or "paired" in n for n in notes)
    given = choice_notes(avg, "nowhere", "gatesight", given_reference="nowhere", defaults=("gatesight", "kvzip"))
    assert given == ["--reference nowhere: no nowhere rows, so no confidence intervals; name one of gatesight", *notes]
    two = headline_rows() + [{**r, "method": "snapkv", "allocation": "flat"} for r in headline_rows()
                             if r["method"] == "gatesight"]  # fmt: skip
    avg2 = T.averaged(T.task_scores(usable(frame(two))))
    assert choice_notes(avg2, "gatesight", "gatesight", defaults=("gatesight", "kvzip")) == [
        'the "Every method against" tables compare with gatesight (no kvzip rows); --compare METHOD picks another'
    ]


def test_a_run_of_only_the_reference_says_so_in_one_line():
    rows = [r for r in headline_rows() if r["method"] == "full"]
    out = render_rich(rows)
    assert not [t for t in out if isinstance(t, Table)] and len([h for h in out if isinstance(h, Heading)]) == 1
    lines = printed(rows, 150)
    said = [line for line in lines if line.startswith("Only no-prune rows (full) here, nothing to compare")]
    assert said == [
        "Only no-prune rows (full) here, nothing to compare: kv 40.0, mf 20.0, prefix_suffix 10.0, vt 30.0. Add a "
        "method: --method NAME."
    ]
