"""``kvbench report``: the paper's figures and tables from result rows.

A small package, data -> tables -> figures -> renderers; every view is one function on the DataFrame of
:func:`kvbench.report.data.load` / :func:`kvbench.report.data.frame`:

* :mod:`.data` — rows (``results*.jsonl``, read-only) -> DataFrame, ``missing.json``, manifests;
* :mod:`.tables` — task scores, averaged curves, main table, paired bootstrap CIs, scorer sensitivity,
  every method against one (the comparison table), allocation ablation, cost table, memory / serving view
  (pure functions);
* :mod:`.figures` — per-task and averaged accuracy-vs-p curves (matplotlib);
* :mod:`.terminal` — the compact per-task tables (markdown and rich, what the CLI prints);
* :mod:`.render` — the report directory: ``index.html``, ``report.md``, CSV + LaTeX tables, PNG + PDF figures.
"""

from kvbench.report.data import frame, load
from kvbench.report.terminal import RANDOM_WARNING, missing_lines, render_markdown, render_rich, summarize, write_report

__all__ = ["RANDOM_WARNING", "frame", "load", "missing_lines", "render_markdown", "render_rich", "summarize",
           "write_report"]  # fmt: skip
