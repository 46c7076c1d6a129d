"""``kvbench paper``'s checks before any work: every argument (one line each, exit 2, as ``kvbench run``'s), the
``--out`` directory, and the data and corpus the plan's grids need (so a paper-scale run stops in one line before
its first grid, not at the first grid that lacks them)."""

from __future__ import annotations

import os
from pathlib import Path

from kvbench.errors import KvbenchError

__all__ = ["MAX_LENGTH", "check_inputs", "check_out", "parse_args"]

#: the longest cost-grid context accepted (tokens): 4x the paper's longest, 256K
MAX_LENGTH = 1 << 20


def _items(option: str, text: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or "" in items:
        raise KvbenchError(f"{option} {text!r} has an empty entry; give a comma-separated list, e.g. {option} 0.7,0.1")
    dup = sorted({x for x in items if items.count(x) > 1})
    if dup:
        raise KvbenchError(f"{option} {text!r} repeats {', '.join(dup)}; give each value once")
    return items


def _numbers(option: str, text: str | None, cast: type, low: float, high: float, example: str) -> tuple | None:
    """``text`` (a comma list) as numbers of ``cast`` in [``low``, ``high``] (``low`` exclusive for floats), each
    once; None when not given."""
    if text is None:
        return None
    out = []
    for item in _items(option, text):
        try:
            value = cast(item)
        except ValueError:
            raise KvbenchError(f"{option} {text!r}: {item!r} is not a number; e.g. {option} {example}") from None
        if not (low < value if cast is float else low <= value) or value > high:
            raise KvbenchError(f"{option} {text!r}: {item} is outside {low:g} to {high:g}; e.g. {option} {example}")
        out.append(value)
    if len({round(v, 4) for v in out}) < len(out):
        raise KvbenchError(f"{option} {text!r} repeats a value; give each once")
    return tuple(out)


def parse_args(
    *,
    fractions: str | None,
    lengths: str | None,
    threads: int | None,
    engine: str,
    corpus: Path | None,
    data_dir: Path | None,
    limit: int | None,
    repeats: int | None,
    dtype: str | None,
) -> dict:
    """Every argument of ``kvbench paper`` checked; the parsed ``ps`` and ``lengths``. ``dtype`` is checked
    against the model loader's choices (None: not checked, e.g. for a dry run, which loads no torch)."""
    from kvbench.engines import ENGINES

    ps = _numbers("--p", fractions, float, 0.0, 1.0, "0.7,0.1 (kept fractions in (0, 1])")
    lens = _numbers("--lengths", lengths, int, 64, MAX_LENGTH, "4096,16384 (tokens; the paper's longest: 262144)")
    if threads is not None and threads < 1:
        raise KvbenchError(f"--threads {threads}: need at least 1 (or omit it for torch's default)")
    if engine not in ENGINES.names():
        raise KvbenchError(f"--engine {engine!r}: give one of {', '.join(ENGINES.names())}")
    if limit is not None and limit < 1:
        raise KvbenchError(f"--limit {limit}: give at least 1 item per task")
    if repeats is not None and repeats < 1:
        raise KvbenchError(f"--repeats {repeats}: give at least 1")
    if corpus is not None and not corpus.is_dir():
        raise KvbenchError(f"--corpus {corpus} is not a directory; give one subdirectory per corpus of documents")
    if data_dir is not None and not data_dir.is_dir():
        raise KvbenchError(f"--data-dir {data_dir} is not a directory; `kvbench data fetch --data-dir DIR` fills one")
    if dtype is not None:
        from kvbench.models import check_dtype

        check_dtype(dtype)
    return {"ps": ps, "lengths": lens}


def check_out(out: Path) -> None:
    """``--out`` is a directory or can become one: one line naming the path and the fix otherwise."""
    if out.exists() and not out.is_dir():
        raise KvbenchError(f"--out {out} is a file; give a directory")
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise KvbenchError(
            f"--out {out}: {probe} is not writable; choose a --out in a writable place, or make {probe} writable"
        )


def missing_data(p) -> list[str]:
    """What the plan's run grids need that ``$KVBENCH_DATA_DIR`` lacks, one entry per file or bench:
    ``"ruler/squad.json (qa_1)"``, ``"scbench kv, qa_eng"``, … (empty: nothing missing)."""
    from kvbench.tasks import ruler_tasks, scbench
    from kvbench.tasks.scbench_generate import GENERATED_TASKS

    root = ruler_tasks.data_dir()
    scb = scbench.data_root()
    files: dict[str, list[str]] = {}
    hub: list[str] = []
    for grid in p.grids:
        if grid.kind != "run":
            continue
        for task in grid.tasks:
            if grid.bench == "ruler" and task in ruler_tasks.DATA_FILES:
                rel = ruler_tasks.DATA_FILES[task]
                if root is None or not (root / rel).is_file():
                    files.setdefault(rel, []).append(task)
            elif grid.bench == "scbench" and task not in GENERATED_TASKS:
                if os.environ.get(scbench.HUB_ENV) != "1" and (scb is None or not scbench.find_task_files(scb, task)):
                    hub.append(task)
    out = [f"{rel} ({', '.join(dict.fromkeys(tasks))})" for rel, tasks in files.items()]
    return out + ([f"scbench {', '.join(dict.fromkeys(hub))}"] if hub else [])


def check_inputs(p, corpus: Path | None) -> None:
    """The data the plan's run grids need, and at paper scale the label corpus: one line naming what is missing
    and the fix, before any grid runs."""
    missing = missing_data(p)
    if missing:
        raise KvbenchError(
            f"kvbench paper --scale {p.scale} needs bench data it cannot find: {'; '.join(missing)}; fetch it with "
            "`kvbench data fetch all --data-dir DIR` (online) and pass --data-dir DIR"
        )
    if p.scale == "paper" and corpus is None:
        raise KvbenchError(
            "kvbench paper --scale paper needs --corpus DIR (GateSight's label corpus, one subdirectory per subset: "
            "Tables 1/5/6/7, Figures 1/2/6/7/8 and the hub models' calibration); --dry-run shows the grids"
        )
