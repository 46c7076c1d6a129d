"""kvbench's output when it is not a terminal (a CI log, ``> file``, ``nohup``): its messages are never wrapped,
no colour codes, and progress is one plain line per finished context, never a carriage-return redraw; in a
terminal the rich console and live bar stay as they were."""

from __future__ import annotations

import io
import re

from rich.progress import Progress

from kvbench.logs import LineProgress, make_console, make_progress
from kvbench.run import loop as runner
from tests.test_cli import MODEL, kvbench

SHA = "bb96e2e1" * 8
PROGRESS_LINE = re.compile(r"^(?P<what>.+): (?P<done>\d+)/(?P<total>\d+|\?) done, \d+:\d\d:\d\d elapsed$")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_message_is_one_line_without_colour_in_a_log():
    out = io.StringIO()
    console = make_console(file=out)
    message = "triattention scores with the artifact of sha256 " + SHA + " (rows record it) " + "x" * 200
    console.print(message, style="bold yellow")
    assert out.getvalue() == message + "\n"  # one line, and no escape codes


def test_the_terminal_keeps_rich_defaults():
    console = make_console(file=_Tty())
    assert console.is_terminal and not console.soft_wrap and not console.no_color
    assert isinstance(make_progress(console), Progress)


def test_line_progress_is_one_line_per_finished_unit():
    out = io.StringIO()
    now = [0.0]
    with LineProgress(make_console(file=out), every_s=30, clock=lambda: now[0]) as progress:
        bar = progress.add_task("contexts", total=3)
        for i in range(3):
            progress.update(bar, description=f"niah #{i} \\[pyramid] p=0.5: fork")  # markup, as for rich
            now[0] += 5
            progress.advance(bar)
    lines = out.getvalue().splitlines()
    assert lines == [f"niah #{i} [pyramid] p=0.5: fork: {i + 1}/3 done, 0:00:{5 * (i + 1):02d} elapsed"
                     for i in range(3)]


def test_line_progress_says_something_every_n_seconds_while_a_unit_runs():
    out = io.StringIO()
    now = [0.0]
    with LineProgress(make_console(file=out), every_s=30, clock=lambda: now[0]) as progress:
        bar = progress.add_task("contexts", total=2)
        for step in range(7):  # one long context: a status change every 10 s, nothing finished
            now[0] += 10
            progress.update(bar, description=f"step {step}")
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["step 2", "step 5", "step 6"]  # 30 s apart, then the last state
    assert all(PROGRESS_LINE.match(ln) for ln in lines)


def test_run_log_has_whole_messages_and_a_line_per_context(tmp_path, monkeypatch, capsys):
    """``kvbench run`` with stderr captured (not a terminal): the artifact line of the issue stays one line, and the
    progress is one line per finished context, without carriage returns."""

    def artifacts(plan, lm, store):
        return {m.label: (SHA if m.name == "snapkv" else None) for m, _, _ in plan}

    monkeypatch.setattr(runner, "method_artifacts", artifacts)
    code = kvbench("run", *MODEL, "--method", "full,snapkv", "--p", "0.5", "--limit", "3", "--length", "900",
                   "--answer-contexts", "1", "--out", str(tmp_path / "run"))
    err = capsys.readouterr().err
    assert code == 0, err
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    assert f"snapkv scores with the artifact of sha256 {SHA[:16]}… (rows record it)" in lines
    done = [int(m["done"]) for m in map(PROGRESS_LINE.match, lines) if m]
    assert done == [1, 2, 3], err


def test_throttled_line_progress_says_bytes_every_n_seconds_and_at_the_end():
    out = io.StringIO()
    now = [0.0]
    with LineProgress(make_console(file=out), clock=lambda: now[0], throttle_s=10) as progress:
        task = progress.add_task("ruler/squad.json", total=100)
        for _ in range(25):  # 4 bytes a second
            now[0] += 1
            progress.advance(task, 4)
    assert [ln.split(": ")[1] for ln in out.getvalue().splitlines()] == ["40/100 done, 0:00:10 elapsed",
                                                                          "80/100 done, 0:00:20 elapsed",
                                                                          "100/100 done, 0:00:25 elapsed"]


def test_line_progress_shows_free_fields_and_training_uses_it_in_a_log(capsys):
    out = io.StringIO()
    now = [0.0]
    with LineProgress(make_console(file=out), clock=lambda: now[0]) as progress:
        job = progress.add_task("train", total=2, info="")
        now[0] += 3
        progress.update(job, advance=1, info="len 128 loss 1.2345")
    assert out.getvalue() == "train: 1/2 done, 0:00:03 elapsed, len 128 loss 1.2345\n"
    from kvbench_training.loop import _progress_bar

    assert isinstance(_progress_bar(True), LineProgress)  # stdout is captured here: not a terminal
    assert isinstance(_progress_bar(False), Progress)
