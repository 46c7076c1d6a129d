"""kvbench's consoles and progress display, readable both in a terminal and in a log.

In a terminal: rich as usual (colours, a live progress bar redrawn in place). When the output is not a terminal
(a CI log, ``> file``, ``nohup``): kvbench's own messages are never wrapped (one message, one line, whatever
its length), no colour codes, and progress is one plain line each time a unit (a context) finishes, or every
:data:`EVERY_S` seconds while something changes, instead of a redrawn bar."""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

#: Seconds between two progress lines in a log when no unit finished meanwhile (but something changed).
EVERY_S = 60.0


def make_console(stderr: bool = False, file: IO[str] | None = None) -> Console:
    """A console on stdout (or stderr, or ``file``): rich's defaults on a terminal; otherwise soft-wrapped
    (a message longer than the width stays one line) and colourless."""
    console = Console(stderr=stderr, file=file)
    if not console.is_terminal:
        console = Console(stderr=stderr, file=file, soft_wrap=True, no_color=True, highlight=False)
    return console


def quiet_library_bars(stream: IO[str] | None = None) -> None:
    """When ``stream`` (default stderr) is not a terminal, turn off the tqdm bars of huggingface_hub, transformers
    and datasets (loading weights, downloads), which a log would show as carriage-return redraws. Set before
    those libraries are imported (their environment variables) and, for any already imported, through their
    switches."""
    stream = stream or sys.stderr
    if stream.isatty():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()


class LineProgress:
    """The part of :class:`rich.progress.Progress`'s API kvbench uses, written for a log: a line
    ``"<description>: <completed>/<total> done, <elapsed> elapsed"`` whenever a task's ``completed`` count grows
    (with ``throttle_s`` > 0, e.g. for bytes downloaded: only when the task completes or ``throttle_s`` seconds
    after the last line), or ``every_s`` seconds after the last line when its description changed; a last line
    on exit if anything changed since. Never a carriage return or a cursor movement."""

    def __init__(
        self, console: Console, every_s: float = EVERY_S, clock=time.monotonic, throttle_s: float = 0.0
    ) -> None:
        self.console, self.every_s, self._clock, self.throttle_s = console, every_s, clock, throttle_s
        self._tasks: list[dict[str, Any]] = []

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        for task_id, task in enumerate(self._tasks):
            if task["dirty"]:
                self._line(task_id)

    def add_task(self, description: str, total: float | None = None, completed: int = 0, **fields: Any) -> int:
        """A new task; its id. ``fields`` (e.g. ``info``): free values shown after the count, as rich's
        ``{task.fields[...]}`` columns show them."""
        now = self._clock()
        self._tasks.append({"description": description, "total": total, "completed": completed, "start": now,
                            "last": now, "dirty": False, "fields": dict(fields)})
        return len(self._tasks) - 1

    def update(self, task_id: int, *, total: float | None = None, completed: float | None = None,
               advance: float | None = None, description: str | None = None, **fields: Any) -> None:
        """Change a task as :meth:`rich.progress.Progress.update` does; print a line when it finished a unit."""
        task = self._tasks[task_id]
        task["fields"].update(fields)
        before = task["completed"]
        if total is not None:
            task["total"] = total
        if completed is not None:
            task["completed"] = completed
        if advance is not None:
            task["completed"] += advance
        if description is not None and description != task["description"]:
            task["description"], task["dirty"] = description, True
        if task["completed"] > before:
            task["dirty"] = True  # a throttled count still gets its line by the exit
        since = self._clock() - task["last"]
        finished = task["total"] is not None and task["completed"] >= task["total"]
        grew = task["completed"] > before and (finished or since >= self.throttle_s)
        if grew or (task["dirty"] and since >= self.every_s):
            self._line(task_id)

    def advance(self, task_id: int, advance: float = 1) -> None:
        """``advance`` more units done."""
        self.update(task_id, advance=advance)

    def _line(self, task_id: int) -> None:
        task = self._tasks[task_id]
        now = self._clock()
        elapsed = int(now - task["start"])
        total = "?" if task["total"] is None else f"{task['total']:g}"
        done = f"{task['completed']:g}/{total} done"
        clock = f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}"
        what = Text.from_markup(task["description"]).plain  # descriptions are rich markup, as for Progress
        extra = "".join(f", {v}" for v in task["fields"].values() if v not in (None, ""))
        self.console.print(f"{what}: {done}, {clock} elapsed{extra}", markup=False, highlight=False, soft_wrap=True)
        task["last"], task["dirty"] = now, False


def make_progress(console: Console, columns: tuple | None = None, throttle_s: float = 0.0) -> Progress | LineProgress:
    """The progress display for ``console``: on a terminal a live bar of ``columns`` (default: description, bar,
    done/total, elapsed), otherwise :class:`LineProgress` (``throttle_s`` as there)."""
    if not console.is_terminal:
        return LineProgress(console, throttle_s=throttle_s)
    columns = columns or (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=console, transient=False)
