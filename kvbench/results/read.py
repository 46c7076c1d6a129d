"""Reading results (:func:`read_results`, :func:`iter_results`, :func:`iter_file`): every results file of some
directories merged, read-only, beside a running writer: an incomplete last line is skipped and noted, legacy rows
are left out and noted, a row stored twice counts once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.results.io import read_json
from kvbench.results.keys import LEGACY, NEW_KEY, RESULTS_GLOB, RESULTS_NAME, ResultsError, loads_row, parse_keyed


@dataclass
class ResultsRead:
    """What :func:`read_results` found. ``rows``: every distinct row (first occurrence of each key, files
    in name order); ``missing``: ``{"bench/task": reason}`` from every ``missing.json``; ``notes``: one line
    per thing skipped or merged (an incomplete last line, legacy rows, duplicates)."""

    rows: list[dict] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def read_results(dirs: Path | str | Sequence[Path | str]) -> ResultsRead:
    """Merge every ``results*.jsonl`` and ``missing.json`` of ``dirs``, read-only (nothing is ever written,
    moved or truncated, so it works on a read-only directory and beside a running writer)."""
    out = ResultsRead()
    out.rows.extend(iter_results(dirs, out))
    return out


def iter_results(dirs: Path | str | Sequence[Path | str], out: ResultsRead) -> Iterator[dict]:
    """The rows :func:`read_results` returns, one at a time (a paper-sized sweep is never held as dicts);
    ``out.missing`` and ``out.notes`` are filled as the files are read, ``out.rows`` is left alone."""
    seen: set[tuple] = set()
    duplicates = 0
    intern = sys.intern
    for path in results_files(dirs, out):
        stats = FileStats()
        for key, row in iter_file(path, stats):
            key = tuple(map(intern, map(str, key)))  # key fields repeat: stored once
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            yield row
        out.notes += stats.notes(path)
    if duplicates:
        out.notes.append(duplicates_note(duplicates))


def duplicates_note(n: int) -> str:
    """The note a reader gives for ``n`` rows whose key it had already read (only the first one counts)."""
    return f"{n} rows stored more than once (overlapping shards?) were counted once"


def results_files(dirs: Path | str | Sequence[Path | str], out: ResultsRead) -> list[Path]:
    """Every results file of ``dirs``, in reading order (directories as given, files by name); merges each
    directory's ``missing.json`` into ``out.missing``. A ResultsError for a directory that holds neither."""
    dirs = [Path(dirs)] if isinstance(dirs, (str, Path)) else [Path(d) for d in dirs]
    paths: list[Path] = []
    for d in dirs:
        if d.is_file():
            raise ResultsError(f"{d} is a file: give the directory that holds it (its run's --out), e.g. {d.parent}")
        if not d.is_dir():
            raise ResultsError(f"no results directory {d}: run `kvbench run --out {d}` first")
        files = [f for f in sorted(d.glob(RESULTS_GLOB)) if RESULTS_NAME.fullmatch(f.name)]
        missing = read_json(d / "missing.json", dict, "Delete it (the next run rewrites it)") or {}
        if not files and not missing:
            raise ResultsError(f"no results in {d}: run `kvbench run --out {d}` first")
        out.missing.update(missing)
        paths += files
    return paths


@dataclass
class FileStats:
    """What reading (part of) a results file left out: legacy rows, and the incomplete last line's size."""

    legacy: int = 0
    cut_bytes: int = 0

    def add(self, other: FileStats) -> None:
        """Count ``other`` (another span of the same file) in."""
        self.legacy += other.legacy
        self.cut_bytes += other.cut_bytes

    def notes(self, path: Path) -> list[str]:
        """One line per thing left out of ``path``, for :attr:`ResultsRead.notes`."""
        out = []
        if self.cut_bytes:
            out.append(
                f"skipped an incomplete last line in {path} ({self.cut_bytes} bytes: a run is writing it "
                "or was interrupted; rerunning it redoes that row)"
            )
        if self.legacy:
            out.append(
                f"left out {self.legacy} rows of {path} written by an older kvbench: their identity lacks "
                f"some of {', '.join(NEW_KEY)}; `kvbench results upgrade {path.parent}` keeps those that can be "
                "upgraded, rerun into a new --out for the rest"
            )
        return out


def file_spans(path: Path, size: int, parts: int) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges that cut the first ``size`` bytes of a results file into about ``parts``
    pieces at line starts, to read in parallel with :func:`iter_file`; the last one ends at ``size``."""
    cuts = [0]
    with open(path, "rb") as fh:
        for k in range(1, parts):
            at = max(cuts[-1], size * k // parts)
            if at == 0 or at >= size:
                continue
            fh.seek(at - 1)
            fh.readline(size - at + 1)  # to just past the next newline: a line start
            if cuts[-1] < fh.tell() < size:
                cuts.append(fh.tell())
    return list(zip(cuts, [*cuts[1:], size], strict=True))


def iter_file(
    path: Path,
    stats: FileStats,
    span: tuple[int, int] | None = None,
    last: bool = True,
    decode: Callable[[bytes], Any] = loads_row,
) -> Iterator[tuple[tuple, dict]]:
    """``(row_key(row), row)`` for the rows of one results file, line by line, by the rules of :func:`scan_results` (a
    bad line that is not the file's last is corruption; an incomplete last line is skipped and counted in
    ``stats``, legacy rows too), without changing the file. ``span``: only the bytes ``[start, end)`` (a
    :func:`file_spans` piece; default: the whole file as long as it is when opened, never what a writer
    appends meanwhile); ``last``: whether the span ends the file. ``decode``: line -> dict of the row's fields, a
    ValueError for a line that is not JSON (default :func:`loads_row`, every field; a reader that needs only some
    fields may decode only those, as long as they include the key's)."""
    if path.is_dir():
        raise ResultsError(f"{path} is a directory, not a results file: move it away or use a different --out")
    try:
        with open(path, "rb") as fh:
            start, end = span if span is not None else (0, os.fstat(fh.fileno()).st_size)
            fh.seek(start)
            remaining = end - start
            number, bad = 0, None  # ``bad``: the last bad line seen, corruption unless it turns out last
            while remaining > 0 and (line := fh.readline(remaining)):
                remaining -= len(line)
                number += 1
                if bad is not None:
                    raise _corrupt(path, fh, start, number - 1)
                parsed = parse_keyed(line, decode) if line.strip() else None
                if parsed is None:
                    bad = line
                    continue
                if parsed[1] == LEGACY:
                    stats.legacy += 1
                    continue
                yield parsed[1], parsed[0]
            if bad is not None and not last:
                raise _corrupt(path, fh, start, number)
    except OSError as e:
        fix = "fix its permissions or use another --out"
        raise ResultsError(f"cannot read {path} ({e.strerror or e}); {fix}") from None
    if bad is not None:
        stats.cut_bytes += len(bad)


def _corrupt(path: Path, fh, start: int, number: int) -> ResultsError:
    """The error for bad line ``number`` (counted from ``start``) of an open results file."""
    fh.seek(0)
    before = fh.read(start).count(b"\n")
    return ResultsError(
        f"{path}: line {before + number} is not a valid result row; fix or delete that line by hand "
        "(reading changes nothing)"
    )
