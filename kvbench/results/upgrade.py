"""``kvbench results upgrade`` (:func:`upgrade_results`): a results directory of an older kvbench brought up to
today's row identity, each changed file's original bytes saved beside it first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.results.io import atomic_write, read_file_bytes, write_error
from kvbench.results.keys import (
    LEGACY,
    NEW_KEY,
    RESULTS_GLOB,
    RESULTS_NAME,
    UPGRADE_TO_NULL_FIELDS,
    ResultsError,
    dumps_row_line,
    parse_keyed,
    row_key,
)
from kvbench.results.lock import ResultsLock, check_results_file
from kvbench.results.scan import scan_results


@dataclass
class Upgrade:
    """What :func:`upgrade_results` did (or, with ``dry_run``, would do) to one results file."""

    path: Path
    current: int = 0  #: rows already carrying today's identity, kept byte for byte
    upgraded: int = 0  #: legacy rows that lacked only ``artifact_sha256`` and were given ``null``
    left_out: dict[str, int] = field(default_factory=dict)  #: reason -> rows removed from the file
    backup: Path | None = None  #: the file's original bytes (None when nothing changed or ``dry_run``)

    @property
    def changed(self) -> bool:
        return bool(self.upgraded or self.left_out)


def _row_line(row: dict) -> bytes | None:
    """``row``'s line as the results store writes it, or None when it holds NaN or Infinity (which the store
    refuses, and which an older kvbench may have written)."""
    try:
        return dumps_row_line(row)
    except ValueError:
        return None


def _upgrade_lines(data: bytes, path: Path, artifact_free: Callable[[str], bool], taken: set[tuple]) -> tuple:
    """``(Upgrade, new file bytes)`` for one results file's bytes. ``taken``: the keys of the directory's current
    rows and of the rows upgraded so far (updated). ``data`` has passed :func:`scan_results`, so only its last line
    can fail to be a row: it is left out."""
    report, out = Upgrade(path), []
    lines = data.split(b"\n")
    tail = lines.pop()
    if tail:
        lines.append(tail)  # a last line without its newline: parsed like the others
    for line in lines:
        parsed = parse_keyed(line)  # the readers' and writers' own classification
        if parsed is None:  # only the last line can be one (scan_results checked)
            reason = "an incomplete last line (a run stopped mid-write)"
        elif parsed[1] != LEGACY:  # today's row: kept byte for byte
            report.current += 1
            out.append(line + b"\n")
            continue
        else:
            row = parsed[0]
            missing = [k for k in NEW_KEY if k not in row]
            if not UPGRADE_TO_NULL_FIELDS.issuperset(missing):
                reason = f"the row lacks {', '.join(missing)}"
            elif not artifact_free(str(row["method"])):
                reason = (
                    f"method {row['method']} reads (or may read) a calibration artifact, which the row does not name"
                )
            elif (key := row_key(row := {**row, **dict.fromkeys(missing)})) in taken:
                reason = "a duplicate of a row already in the directory"
            elif (row_line := _row_line(row)) is None:  # readers accept NaN; today's writer refuses it
                reason = "the row holds NaN or Infinity, which the results store does not write"
            else:
                taken.add(key)
                report.upgraded += 1
                out.append(row_line)
                continue
        report.left_out[reason] = report.left_out.get(reason, 0) + 1
    return report, b"".join(out)


def upgrade_results(out_dir: Path | str, artifact_free: Callable[[str], bool], *, dry_run: bool = False) -> list:
    """Bring a results directory written by an older kvbench up to today's row identity, so runs resume into it
    and reports include its rows. Returns one :class:`Upgrade` per results file.

    A legacy row that lacks only ``artifact_sha256`` and whose method ``artifact_free(name)`` declares no
    calibration artifact gets ``"artifact_sha256": null`` (exactly what today's code records for it). Every other
    legacy row (a method with an artifact, or one that cannot be looked up: the row cannot say which file it was
    scored with; an older row lacking more of the key; one holding NaN or Infinity, which today's store does not
    write), a duplicate and an incomplete last line are removed from the file. Nothing is lost: each changed
    file's original bytes are first saved, fsynced, beside it as ``<file>.pre-upgrade-<ns>`` (a name readers and
    writers ignore), then the file is replaced atomically. Every results file is locked like a writer's for the
    whole upgrade, so a running ``kvbench run`` makes it refuse (``dry_run`` takes no lock and writes nothing). A
    corrupt line anywhere but last refuses the whole directory.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ResultsError(f"{out_dir} is not a results directory (give the --out of a kvbench run)")
    paths = [p for p in sorted(out_dir.glob(RESULTS_GLOB)) if RESULTS_NAME.fullmatch(p.name) and p.is_file()]
    if not paths:
        raise ResultsError(f"{out_dir} has no results files ({RESULTS_GLOB}); give the --out of a kvbench run")
    locks: list[ResultsLock] = []
    try:
        for p in [] if dry_run else paths:  # a dry run only reads, like a report
            check_results_file(p)
            lock_path = p.with_name(p.name + ".lock")
            try:
                locks.append(ResultsLock(lock_path, wait=False))
            except BlockingIOError:
                raise ResultsError(
                    f"{p} is being written by {ResultsLock.holder(lock_path)}: let that run finish, then upgrade"
                ) from None
        data = {p: read_file_bytes(p) for p in paths}
        taken = {
            row_key(r) for p in paths for r in scan_results(data[p], p).rows
        }  # an upgraded row never displaces one
        reports = [_upgrade_lines(data[p], p, artifact_free, taken) for p in paths]
        if dry_run:
            return [r for r, _ in reports]
        for report, text in reports:
            if not report.changed:
                continue
            backup = report.path.with_name(f"{report.path.name}.pre-upgrade-{time.time_ns()}")
            try:
                with open(backup, "xb") as f:
                    f.write(data[report.path])
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise write_error(backup, e, 0) from None
            atomic_write(report.path, text)
            report.backup = backup
        return [r for r, _ in reports]
    finally:
        for lock in locks:
            lock.release()
