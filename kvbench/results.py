"""Results store: one JSON row per finished question in ``<out>/results.jsonl``, plus ``manifest.json``.

Rows are appended with a single ``os.write`` + ``fsync`` each, so a crash can at worst leave one partial
last line; reopening the store detects it, saves the dropped bytes to ``results.jsonl.partial-<time>``
and truncates the file back to its last complete row. A run resumes by skipping keys that are done.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvbench.errors import KvbenchError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ROW_KEY", "ResultsError", "ResultsStore", "row_key"]

ROW_KEY: tuple[str, ...] = (
    "model",
    "engine",
    "method",
    "allocation",
    "p",
    "bench",
    "task",
    "item",
    "question",
)


class ResultsError(KvbenchError):
    """A results directory or file that cannot be used as is; the message names the fix."""


def row_key(row: Mapping[str, Any]) -> tuple:
    """The identity of a row: its ROW_KEY fields, ``p`` rounded to 4 decimals, everything else ``str``."""
    missing = [k for k in ROW_KEY if k not in row]
    if missing:
        raise ResultsError(f"row is missing key field(s) {missing}; every row needs all of {list(ROW_KEY)}")
    try:
        p = round(float(row["p"]), 4)
    except (TypeError, ValueError):
        raise ResultsError(
            f"row field p={row['p']!r} is not a number (the kept fraction, e.g. 0.5)"
        ) from None
    return tuple(p if k == "p" else str(row[k]) for k in ROW_KEY)


def _parse(line: bytes) -> dict | None:
    """The row stored on one line, or None when the line is not a complete, valid row."""
    try:
        row = json.loads(line)
        return row if isinstance(row, dict) and row_key(row) else None
    except (ValueError, ResultsError):
        return None


class ResultsStore:
    """Append-only, crash-safe store of finished rows in ``<out_dir>/results.jsonl``."""

    def __init__(self, out_dir: str | Path) -> None:
        """Open (creating if needed) the results directory, recover from a crash mid-write, load the rows."""
        self.dir = Path(out_dir)
        self.path = self.dir / "results.jsonl"
        self.manifest_path = self.dir / "manifest.json"
        self.recovered: str | None = None
        self._rows: dict[tuple, dict] = {}
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ResultsError(
                f"cannot create or write the results directory {self.dir} ({e.strerror or e}); "
                "pick another one with --out"
            ) from None
        if self.path.exists():
            self._load()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _load(self) -> None:
        """Read results.jsonl; repair an interrupted last line, refuse corruption anywhere else."""
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        tail = lines.pop()  # bytes after the last newline: b"" when the file ends cleanly
        good_end = 0  # byte offset just past the last complete, valid line
        for i, line in enumerate(lines):
            row = _parse(line)
            if row is None:
                if i == len(lines) - 1 and not tail:
                    break  # a bad last line is a crash signature: dropped below
                raise ResultsError(
                    f"{self.path}: line {i + 1} is not a valid result row; the file was not modified. "
                    "Fix or delete that line by hand, or use a different --out directory"
                )
            self._rows.setdefault(row_key(row), row)
            good_end += len(line) + 1
        row = _parse(tail) if tail else None
        if row is not None:  # complete row that only lacks its newline
            with open(self.path, "ab") as f:
                f.write(b"\n")
                os.fsync(f.fileno())
            self._rows.setdefault(row_key(row), row)
            self.recovered = (
                "results.jsonl: added the missing newline after the last row (interrupted run); "
                f"{len(self._rows)} finished rows kept"
            )
        elif good_end < len(data):
            dropped = data[good_end:]
            partial = self.path.with_name(f"{self.path.name}.partial-{int(time.time())}")
            partial.write_bytes(dropped)
            os.truncate(self.path, good_end)
            self.recovered = (
                f"results.jsonl: dropped a partial last line ({len(dropped)} bytes, saved to {partial.name}) "
                f"left by an interrupted run; {len(self._rows)} finished rows kept"
            )

    def is_done(self, key_or_row: Mapping[str, Any] | Sequence[Any]) -> bool:
        """Whether a row with this key (a ROW_KEY tuple or a row mapping) is already stored."""
        row = key_or_row if isinstance(key_or_row, Mapping) else dict(zip(ROW_KEY, key_or_row, strict=True))
        return row_key(row) in self._rows

    def append(self, row: dict) -> None:
        """Durably append one finished row (p normalised); refuse duplicates and non-JSON values."""
        if self._fd is None:
            raise ResultsError(f"the results store {self.path} is closed")
        key = row_key(row)
        if key in self._rows:
            raise ResultsError(f"row {key} is already in {self.path}; skip done rows with is_done()")
        row = {**row, "p": key[ROW_KEY.index("p")]}
        try:
            buf = (json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        except (TypeError, ValueError) as e:
            raise ResultsError(
                f"row {key} cannot be stored as JSON ({e}); results must be finite numbers, strings, "
                "lists or dicts — fix the value that produced it"
            ) from None
        while buf:
            buf = buf[os.write(self._fd, buf) :]
        os.fsync(self._fd)
        self._rows[key] = row

    def rows(self) -> list[dict]:
        """Every finished row, in file order, first occurrence of each key."""
        return list(self._rows.values())

    def __len__(self) -> int:
        """Number of distinct finished rows."""
        return len(self._rows)

    def manifest(self) -> dict:
        """The manifest, ``{"runs": [...]}`` (empty when no run wrote one yet)."""
        if not self.manifest_path.exists():
            return {"runs": []}
        try:
            manifest = json.loads(self.manifest_path.read_bytes())
        except ValueError:
            manifest = None
        if not (isinstance(manifest, dict) and isinstance(manifest.get("runs"), list)):
            raise ResultsError(
                f'{self.manifest_path} is corrupt (expected JSON {{"runs": [...]}}); it was left as is. '
                "Repair or move it away, or use a different --out directory"
            )
        return manifest

    def write_manifest(self, entry: dict) -> None:
        """Atomically add one run entry (versions, seeds, config, ``model``, ``model_fingerprint``)."""
        manifest = self.manifest()
        name, fingerprint = entry.get("model"), entry.get("model_fingerprint")
        for run in manifest["runs"]:
            if run.get("model") == name and run.get("model_fingerprint") != fingerprint:
                raise ResultsError(
                    f"{self.dir} already holds results of a different model named {name!r} "
                    f"(fingerprint {run.get('model_fingerprint')} != {fingerprint}); rows of two different "
                    "models with the same name would be mixed. Use a different --out directory"
                )
        manifest["runs"].append(entry)
        data = json.dumps(manifest, ensure_ascii=False, indent=2) + "\n"
        tmp = self.manifest_path.with_name("manifest.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.manifest_path)

    @property
    def missing_path(self) -> Path:
        return self.dir / "missing.json"

    def missing(self) -> dict[str, str]:
        """Tasks that could not run for lack of data: ``{"bench/task": reason}``."""
        if not self.missing_path.exists():
            return {}
        try:
            data = json.loads(self.missing_path.read_bytes())
        except ValueError:
            raise ResultsError(f"{self.missing_path} is corrupt; delete it (the next run rewrites it)") from None
        return data if isinstance(data, dict) else {}

    def record_missing(self, bench: str, task: str, reason: str) -> None:
        """Atomically record that ``bench/task`` is missing its data (shown as missing in reports)."""
        data = {**self.missing(), f"{bench}/{task}": reason}
        tmp = self.missing_path.with_name("missing.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.missing_path)

    def close(self) -> None:
        """Close the results file; later appends raise."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Self:
        """Use as a context manager that closes the store on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()
