"""Reading and replacing the files of a results directory, each failure a :class:`ResultsError` that names the
file and the fix: a file's bytes, a JSON file (``manifest.json``, ``missing.json``), an atomic rewrite.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

from kvbench.atomic import write_atomic
from kvbench.results.keys import ResultsError


def read_file_bytes(path: Path) -> bytes:
    """A file's bytes, or a ResultsError naming the file and the fix."""
    if path.is_dir():
        raise ResultsError(f"{path} is a directory, not a results file: move it away or use a different --out")
    try:
        return path.read_bytes()
    except OSError as e:
        fix = "fix its permissions or use another --out"
        raise ResultsError(f"cannot read {path} ({e.strerror or e}); {fix}") from None


def write_error(path: Path, e: OSError, saved: int) -> ResultsError:
    """The one-line message for a failed write of ``path`` (a full disk, a read-only file, …)."""
    reason = "the disk is full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return ResultsError(
        f"cannot write {path}: {reason}; {saved} finished rows are saved there. Fix that "
        "(free space, permissions) and rerun the same command: it resumes where it stopped"
    )


def atomic_write(path: Path, text: str | bytes) -> None:
    """Replace ``path`` by ``text`` (str: UTF-8) atomically (:func:`kvbench.atomic.write_atomic`)."""
    try:
        write_atomic(path, text)
    except OSError as e:
        raise write_error(path, e, 0) from None


def read_json(path: Path, expect: type, fix: str) -> Any:
    """The JSON value of ``path`` (None when absent); a ResultsError when unreadable or not ``expect``."""
    if not path.exists():
        return None
    try:
        data = json.loads(read_file_bytes(path))
    except ValueError:
        data = None
    if not isinstance(data, expect):
        raise ResultsError(f"{path} is corrupt; it was left as is. {fix}")
    return data
