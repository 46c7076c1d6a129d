"""The results store (:class:`ResultsStore`): the one writer of a results file, append-only, crash-safe and locked
while open, and of the directory's ``manifest.json`` and ``missing.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvbench.results.io import atomic_write, read_file_bytes, read_json, write_error
from kvbench.results.keys import (
    RESULTS_GLOB,
    RESULTS_NAME,
    ROW_KEY,
    ResultsError,
    dumps_row_line,
    legacy_error,
    results_name,
    row_key,
)
from kvbench.results.lock import ResultsLock, check_results_file
from kvbench.results.scan import Scan, repair_tail, scan_results

if TYPE_CHECKING:
    from typing_extensions import Self


def _remove_dirs(dirs: Sequence[Path]) -> None:
    """Remove the directories ``dirs`` (deepest first) while they are empty."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            return


class ResultsStore:
    """The one writer of ``<out_dir>/results_name(shard)``: append-only, crash-safe, locked while open.

    It writes nothing until its first write: opening locks the file and reads the directory; the results file
    is created, a crash's last line repaired (:attr:`recovered`) and the updates queued with :meth:`defer` made
    at the first :meth:`append`. A store closed without any write removes the lock file and the directories it
    created, so a run that stops before its first row leaves its ``--out`` exactly as it was."""

    def __init__(self, out_dir: str | Path, shard: tuple[int, int] = (0, 1)) -> None:
        """Lock this shard's results file (creating the results directory if needed) and load the rows done in
        every results file of the directory; refuse corruption, legacy rows, a results file that is not a
        regular file of its own, and one that cannot be written."""
        self.dir = Path(out_dir)
        self.path = self.dir / results_name(shard)
        self.manifest_path = self.dir / "manifest.json"
        self.recovered: str | None = None
        self._rows: dict[tuple, dict] = {}
        self._done: set[tuple] = set()  # keys of rows in the directory's other results files
        self._fd: int | None = None
        self._closed = False
        self._wrote = False  # anything written into the directory (then close() keeps what open created)
        self._begun = False  # the first append happened: repair made, deferred updates written
        self._repair: Scan | None = None
        self._deferred: list[Callable[[], None]] = []
        self._lock: ResultsLock | None = None
        self._created: list[Path] = []
        self._created = self._make_dir()
        try:
            check_results_file(self.path)
            lock_path = self.path.with_name(self.path.name + ".lock")
            try:
                self._lock = ResultsLock(lock_path, wait=False)
            except BlockingIOError:
                raise ResultsError(
                    f"{self.path} is being written by another kvbench run, "
                    f"{ResultsLock.holder(lock_path)}: wait for it "
                    "to finish, or use another --out (shards of one run: --shard i/N, each its own file)"
                ) from None
            self._open()
        except BaseException:
            self.close()
            raise

    def _make_dir(self) -> list[Path]:
        """Create the results directory if needed and check that it is writable; return the directories
        created, deepest first."""
        created, d = [], self.dir
        while not d.exists() and d != d.parent:
            created.append(d)
            d = d.parent
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            _remove_dirs(created)
            raise ResultsError(
                f"cannot create or write the results directory {self.dir} ({e.strerror or e}); "
                "pick another one with --out"
            ) from None
        return created

    def _open(self) -> None:
        """Under the lock: load this file, note the other files' rows, open an existing file for appending."""
        if self.path.exists():
            self._load()
        for other in sorted(self.dir.glob(RESULTS_GLOB)):
            if other != self.path and RESULTS_NAME.fullmatch(other.name) and other.is_file():
                scan = scan_results(read_file_bytes(other), other)
                if scan.legacy:
                    raise legacy_error(other, scan.legacy)
                self._done.update(row_key(r) for r in scan.rows)
        if self.path.exists():  # a file that cannot be written is refused now; a new one is created by append
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            except OSError as e:
                raise write_error(self.path, e, len(self._rows)) from None

    def _load(self) -> None:
        """Read this results file: refuse corruption and legacy rows, note an interrupted last line (repaired by
        the first append)."""
        scan = scan_results(read_file_bytes(self.path), self.path)
        if scan.legacy:
            raise legacy_error(self.path, scan.legacy)
        for row in scan.rows:
            self._rows.setdefault(row_key(row), row)
        if scan.tail_row is not None:  # complete row that only lacks its newline
            self._rows.setdefault(row_key(scan.tail_row), scan.tail_row)
        if scan.tail:
            self._repair = scan

    def _begin(self) -> None:
        """Before the first row: create the results file (or repair an interrupted last line of the existing one),
        then make the updates queued with :meth:`defer`."""
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as e:
                raise write_error(self.path, e, len(self._rows)) from None
        self._wrote = True
        if self._repair is not None:  # cleared only once done: a failed repair is retried by the next append
            try:
                self.recovered = repair_tail(self._fd, self.path, self._repair, len(self._rows))
            except OSError as e:
                raise write_error(self.path, e, len(self._rows)) from None
            self._repair = None
        self._begun = True
        deferred, self._deferred = self._deferred, []
        for update in deferred:
            update()

    def defer(self, update: Callable[[], None]) -> None:
        """Make ``update`` (e.g. a :meth:`write_manifest` or :meth:`record_missing` call) just before the first row
        is appended, or now when rows were already appended: a run that ends before its first row writes none."""
        if self._begun:
            update()
        else:
            self._deferred.append(update)

    def is_done(self, key_or_row: Mapping[str, Any] | Sequence[Any]) -> bool:
        """Whether a row with this key (a ROW_KEY tuple or a row mapping) is stored in any results file."""
        row = key_or_row if isinstance(key_or_row, Mapping) else dict(zip(ROW_KEY, key_or_row, strict=True))
        key = row_key(row)
        return key in self._rows or key in self._done

    def recorded_artifacts(self, model: str, model_fingerprint: str) -> dict[str, set[str]]:
        """``{method: {artifact_sha256 text}}`` of the rows of that model and weights in every results file of
        this directory (a method without an artifact records ``"None"``)."""
        i_model, i_fp, i_method, i_sha = (ROW_KEY.index(c) for c in
                                          ("model", "model_fingerprint", "method", "artifact_sha256"))  # fmt: skip
        out: dict[str, set[str]] = {}
        for keys in (self._rows, self._done):
            for key in keys:
                if key[i_model] == model and key[i_fp] == model_fingerprint:
                    out.setdefault(key[i_method], set()).add(key[i_sha])
        return out

    def append(self, row: Mapping[str, Any]) -> None:
        """Durably append one finished row, the JSON object of a :class:`kvbench.rows.Row` (p normalised); refuse
        duplicates and non-JSON values. A failed write (full disk, …) is cut back off the file and raised as a
        ResultsError naming it."""
        if self._closed:
            raise ResultsError(f"the results store {self.path} is closed")
        key = row_key(row)
        if self.is_done(key):
            raise ResultsError(f"row {key} is already in {self.dir}; skip done rows with is_done()")
        row = {**row, "p": key[ROW_KEY.index("p")]}
        try:
            buf = dumps_row_line(row)
        except (TypeError, ValueError) as e:
            raise ResultsError(
                f"row {key} cannot be stored as JSON ({e}); results must be finite numbers, strings, "
                "lists or dicts — fix the value that produced it"
            ) from None
        if not self._begun:
            self._begin()
        size = os.fstat(self._fd).st_size
        try:
            while buf:
                buf = buf[os.write(self._fd, buf) :]
            os.fsync(self._fd)
        except OSError as e:
            try:
                os.ftruncate(self._fd, size)  # no partial line left behind (else the next open sets it aside)
            except OSError:
                pass
            raise write_error(self.path, e, len(self._rows)) from None
        self._rows[key] = row

    def rows(self) -> list[dict]:
        """Every finished row of this store's own file, in file order, first occurrence of each key."""
        return list(self._rows.values())

    def __len__(self) -> int:
        """Number of distinct finished rows in this store's own file."""
        return len(self._rows)

    def _meta_lock(self) -> ResultsLock:
        """The directory's lock for manifest.json / missing.json updates (shards share them); taking it is this
        store's first write into the directory, if nothing came before."""
        if self._closed:
            raise ResultsError(f"the results store {self.path} is closed")
        self._wrote = True
        return ResultsLock(self.dir / "meta.lock", wait=True)

    def manifest(self) -> dict:
        """The manifest, ``{"runs": [...]}`` (empty when no run wrote one yet)."""
        fix = "Repair or move it away, or use a different --out directory"
        manifest = read_json(self.manifest_path, dict, fix) or {"runs": []}
        if not isinstance(manifest.get("runs"), list):
            raise ResultsError(f"{self.manifest_path} is corrupt; it was left as is. {fix}")
        return manifest

    def check_model(self, name: str | None, fingerprint: str | None, manifest: dict | None = None) -> None:
        """Refuse a model named like one of the manifest's runs but with other weights (``fingerprint``); reads
        only (``manifest``: the one already read)."""
        for run in (manifest or self.manifest())["runs"]:
            if run.get("model") == name and run.get("model_fingerprint") != fingerprint:
                raise ResultsError(
                    f"{self.dir} already holds results of a different model named {name!r} "
                    f"(fingerprint {run.get('model_fingerprint')} != {fingerprint}); rows of two different "
                    "models with the same name would be mixed. Use a different --out directory"
                )

    def write_manifest(self, entry: dict) -> None:
        """Atomically add one run entry (versions, seeds, config, ``model``, ``model_fingerprint``); refuse it as
        :meth:`check_model` does."""
        lock = self._meta_lock()
        try:
            manifest = self.manifest()
            self.check_model(entry.get("model"), entry.get("model_fingerprint"), manifest)
            manifest["runs"].append(entry)
            atomic_write(self.manifest_path, json.dumps(manifest, ensure_ascii=False, indent=2) + "\n")
        finally:
            lock.release()

    @property
    def missing_path(self) -> Path:
        return self.dir / "missing.json"

    def missing(self) -> dict[str, str]:
        """Tasks that could not run for lack of data: ``{"bench/task": reason}``."""
        fix = "Delete it (the next run rewrites it)"
        return read_json(self.missing_path, dict, fix) or {}

    def record_missing(self, bench: str, task: str, reason: str) -> None:
        """Atomically record that ``bench/task`` is missing its data (shown as missing in reports)."""
        lock = self._meta_lock()
        try:
            data = {**self.missing(), f"{bench}/{task}": reason}
            atomic_write(self.missing_path, json.dumps(data, ensure_ascii=False, indent=2) + "\n")
        finally:
            lock.release()

    def close(self) -> None:
        """Close the results file and release its lock; later appends raise. A store that wrote nothing removes
        the lock file and the directories it created (updates still queued with :meth:`defer` are dropped)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._wrote:
            if self._lock is not None:
                self._lock.release()
            return
        if self._lock is not None:
            self._lock.discard()
        _remove_dirs(self._created)

    def __del__(self) -> None:
        """A store dropped without close() still releases its file and lock."""
        self.close()

    def __enter__(self) -> Self:
        """Use as a context manager that closes the store on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()
