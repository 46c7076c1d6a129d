"""A whole results file parsed for its writer (:func:`scan_results`): its rows, its legacy rows, and what a crash may
have left after its last complete row, which the writer's first append repairs (:func:`repair_tail`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from kvbench.results.keys import LEGACY, ResultsError, parse_keyed


@dataclass
class Scan:
    """One results file, parsed. ``good_end``: byte offset just past the last complete, valid line.
    ``tail``: what follows it (b"" when the file ends cleanly); ``tail_row`` the row when the tail is a
    complete row that only lacks its newline."""

    rows: list[dict]
    legacy: int
    good_end: int
    tail: bytes
    tail_row: dict | None


def scan_results(data: bytes, path: Path) -> Scan:
    """Parse a results file's bytes; a bad line anywhere but last is corruption (ResultsError)."""
    lines = data.split(b"\n")
    tail = lines.pop()  # bytes after the last newline: b"" when the file ends cleanly
    rows: list[dict] = []
    legacy = good_end = 0
    for i, line in enumerate(lines):
        parsed = parse_keyed(line)
        if parsed is None:
            if i == len(lines) - 1 and not tail:
                tail = line + b"\n"  # a bad last line is a crash signature, not corruption
                break
            raise ResultsError(
                f"{path}: line {i + 1} is not a valid result row; the file was not modified. "
                "Fix or delete that line by hand, or use a different --out directory"
            )
        if parsed[1] == LEGACY:
            legacy += 1
        else:
            rows.append(parsed[0])
        good_end += len(line) + 1
    tail_parsed = parse_keyed(tail) if tail and not tail.endswith(b"\n") else None
    tail_row = None
    if tail_parsed is not None:
        if tail_parsed[1] == LEGACY:
            legacy += 1
        else:
            tail_row = tail_parsed[0]
    return Scan(rows, legacy, good_end, tail, tail_row)


def repair_tail(fd: int, path: Path, scan: Scan, kept: int) -> str:
    """Repair what a crash left after the last complete row of ``path`` (``scan``, open for appending as ``fd``):
    add the missing newline of a complete last row, or set a partial last line aside
    (``<file>.partial-<pid>-<ns>``) and truncate the file back to its last complete row. Returns the message that
    says which (``kept``: the finished rows kept); OSError when a write fails."""
    name = path.name
    if scan.tail_row is not None:
        os.write(fd, b"\n")
        os.fsync(fd)
        return f"{name}: added the missing newline after the last row (interrupted run); {kept} finished rows kept"
    partial = path.with_name(f"{name}.partial-{os.getpid()}-{time.time_ns()}")
    partial.write_bytes(scan.tail)
    try:
        os.ftruncate(fd, scan.good_end)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
    return (
        f"{name}: dropped a partial last line ({len(scan.tail)} bytes, saved to {partial.name}) "
        f"left by an interrupted run; {kept} finished rows kept"
    )
