"""Results store: one JSON row per finished question, plus ``manifest.json`` and ``missing.json``.

Files of a results directory ``<out>``:

* ``results.jsonl`` (an unsharded run) or ``results.shard-{i}-of-{N}.jsonl`` (``--shard i/N``, N > 1):
  one row per line. Each results file has ONE writer (:class:`ResultsStore`), enforced by an exclusive
  ``fcntl.flock`` on ``<results file>.lock`` (which holds the writer's pid and command); a second writer
  gets a :class:`ResultsError` naming that pid. A results file that is a symbolic link or has several hard
  links is refused (a second name would get a lock of its own). Rows are appended with a single ``os.write`` + ``fsync``
  each, so a crash can at worst leave one partial last line; only the writer, holding the lock, sets such
  a line aside (``<file>.partial-<pid>-<ns>``) and truncates the file back to its last complete row, at its
  first append: a writer that ends before its first row leaves the directory as it was.
* ``manifest.json`` / ``missing.json``: rewritten by writers only, under the directory's ``meta.lock``,
  through a unique temporary file in the same directory and ``os.replace``.

Readers (:func:`read_results`) merge every ``results*.jsonl`` of the directories they are given and never
write, move or truncate anything: an incomplete last line (a writer may be appending it) is skipped and
noted. A row's identity is its :data:`ROW_KEY` fields (:class:`kvbench.rows.RowKey` declares them and how a
line lacking one reads); rows written before ``length``, ``seed``, ``context_sha256``, ``model_fingerprint`` and
``artifact_sha256`` joined the key ("legacy" rows) are never reused: a writer refuses a file holding them, a
reader leaves them out and says so.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvbench.results_io import _atomic_write, _read_bytes, _read_json, _write_error
from kvbench.results_keys import (
    _NEW_KEY,
    _RESULTS_NAME,
    _UPGRADE_TO_NULL,
    ENDED_EARLY,
    LEGACY,
    LEGACY_KEY,
    OPTIONAL_KEY,
    RESULTS_GLOB,
    ROW_KEY,
    ResultsError,
    _legacy_error,
    _parse_keyed,
    loads_row,
    results_name,
    row_key,
)
from kvbench.results_lock import _Lock, check_results_file
from kvbench.results_scan import _Scan, _scan

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "ENDED_EARLY",
    "LEGACY_KEY",
    "OPTIONAL_KEY",
    "RESULTS_GLOB",
    "ROW_KEY",
    "ResultsError",
    "ResultsRead",
    "ResultsStore",
    "FileStats",
    "check_results_file",
    "duplicates_note",
    "file_spans",
    "iter_file",
    "iter_results",
    "loads_row",
    "read_results",
    "results_files",
    "results_name",
    "row_key",
    "Upgrade",
    "upgrade_results",
]


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
        self._repair: _Scan | None = None
        self._deferred: list[Callable[[], None]] = []
        self._lock: _Lock | None = None
        self._created: list[Path] = []
        self._created = self._make_dir()
        try:
            check_results_file(self.path)
            lock_path = self.path.with_name(self.path.name + ".lock")
            try:
                self._lock = _Lock(lock_path, wait=False)
            except BlockingIOError:
                raise ResultsError(
                    f"{self.path} is being written by another kvbench run, {_Lock.holder(lock_path)}: wait for it "
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
            if other != self.path and _RESULTS_NAME.fullmatch(other.name) and other.is_file():
                scan = _scan(_read_bytes(other), other)
                if scan.legacy:
                    raise _legacy_error(other, scan.legacy)
                self._done.update(row_key(r) for r in scan.rows)
        if self.path.exists():  # a file that cannot be written is refused now; a new one is created by append
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            except OSError as e:
                raise _write_error(self.path, e, len(self._rows)) from None

    def _load(self) -> None:
        """Read this results file: refuse corruption and legacy rows, note an interrupted last line (repaired by
        the first append)."""
        scan = _scan(_read_bytes(self.path), self.path)
        if scan.legacy:
            raise _legacy_error(self.path, scan.legacy)
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
                raise _write_error(self.path, e, len(self._rows)) from None
        self._wrote = True
        scan, self._repair, name = self._repair, None, self.path.name
        try:
            if scan is not None and scan.tail_row is not None:
                os.write(self._fd, b"\n")
                os.fsync(self._fd)
                self.recovered = (
                    f"{name}: added the missing newline after the last row (interrupted run); "
                    f"{len(self._rows)} finished rows kept"
                )
            elif scan is not None:
                partial = self.path.with_name(f"{name}.partial-{os.getpid()}-{time.time_ns()}")
                partial.write_bytes(scan.tail)
                try:
                    os.ftruncate(self._fd, scan.good_end)
                except OSError:
                    partial.unlink(missing_ok=True)
                    raise
                self.recovered = (
                    f"{name}: dropped a partial last line ({len(scan.tail)} bytes, saved to {partial.name}) "
                    f"left by an interrupted run; {len(self._rows)} finished rows kept"
                )
        except OSError as e:
            raise _write_error(self.path, e, len(self._rows)) from None
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
            buf = (json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
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
            raise _write_error(self.path, e, len(self._rows)) from None
        self._rows[key] = row

    def rows(self) -> list[dict]:
        """Every finished row of this store's own file, in file order, first occurrence of each key."""
        return list(self._rows.values())

    def __len__(self) -> int:
        """Number of distinct finished rows in this store's own file."""
        return len(self._rows)

    def _meta_lock(self) -> _Lock:
        """The directory's lock for manifest.json / missing.json updates (shards share them); taking it is this
        store's first write into the directory, if nothing came before."""
        if self._closed:
            raise ResultsError(f"the results store {self.path} is closed")
        self._wrote = True
        return _Lock(self.dir / "meta.lock", wait=True)

    def manifest(self) -> dict:
        """The manifest, ``{"runs": [...]}`` (empty when no run wrote one yet)."""
        fix = "Repair or move it away, or use a different --out directory"
        manifest = _read_json(self.manifest_path, dict, fix) or {"runs": []}
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
            _atomic_write(self.manifest_path, json.dumps(manifest, ensure_ascii=False, indent=2) + "\n")
        finally:
            lock.release()

    @property
    def missing_path(self) -> Path:
        return self.dir / "missing.json"

    def missing(self) -> dict[str, str]:
        """Tasks that could not run for lack of data: ``{"bench/task": reason}``."""
        fix = "Delete it (the next run rewrites it)"
        return _read_json(self.missing_path, dict, fix) or {}

    def record_missing(self, bench: str, task: str, reason: str) -> None:
        """Atomically record that ``bench/task`` is missing its data (shown as missing in reports)."""
        lock = self._meta_lock()
        try:
            data = {**self.missing(), f"{bench}/{task}": reason}
            _atomic_write(self.missing_path, json.dumps(data, ensure_ascii=False, indent=2) + "\n")
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
        files = [f for f in sorted(d.glob(RESULTS_GLOB)) if _RESULTS_NAME.fullmatch(f.name)]
        missing = _read_json(d / "missing.json", dict, "Delete it (the next run rewrites it)") or {}
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
                f"some of {', '.join(_NEW_KEY)}; `kvbench results upgrade {path.parent}` keeps those that can be "
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
    """``(row_key(row), row)`` for the rows of one results file, line by line, by the rules of :func:`_scan` (a
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
                parsed = _parse_keyed(line, decode) if line.strip() else None
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


def _upgrade_lines(data: bytes, path: Path, artifact_free: Callable[[str], bool], taken: set[tuple]) -> tuple:
    """``(Upgrade, new file bytes)`` for one results file's bytes. ``taken``: the keys of the directory's current
    rows and of the rows upgraded so far (updated). ``data`` has passed :func:`_scan`, so only its last line can fail
    to be a row: it is left out."""
    report, out = Upgrade(path), []
    lines = data.split(b"\n")
    tail = lines.pop()
    if tail:
        lines.append(tail)  # a last line without its newline: parsed like the others
    for line in lines:
        parsed = _parse_keyed(line)  # the readers' and writers' own classification
        if parsed is None:  # only the last line can be one (_scan checked)
            reason = "an incomplete last line (a run stopped mid-write)"
        elif parsed[1] != LEGACY:  # today's row: kept byte for byte
            report.current += 1
            out.append(line + b"\n")
            continue
        else:
            row = parsed[0]
            missing = [k for k in _NEW_KEY if k not in row]
            if not _UPGRADE_TO_NULL.issuperset(missing):
                reason = f"the row lacks {', '.join(missing)}"
            elif not artifact_free(str(row["method"])):
                reason = (
                    f"method {row['method']} reads (or may read) a calibration artifact, which the row does not name"
                )
            elif (key := row_key(row := {**row, **dict.fromkeys(missing)})) in taken:
                reason = "a duplicate of a row already in the directory"
            else:
                taken.add(key)
                report.upgraded += 1
                out.append(json.dumps(row, ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n")
                continue
        report.left_out[reason] = report.left_out.get(reason, 0) + 1
    return report, b"".join(out)


def upgrade_results(out_dir: Path | str, artifact_free: Callable[[str], bool], *, dry_run: bool = False) -> list:
    """Bring a results directory written by an older kvbench up to today's row identity, so runs resume into it
    and reports include its rows. Returns one :class:`Upgrade` per results file.

    A legacy row that lacks only ``artifact_sha256`` and whose method ``artifact_free(name)`` declares no
    calibration artifact gets ``"artifact_sha256": null`` (exactly what today's code records for it). Every other
    legacy row (a method with an artifact, or one that cannot be looked up: the row cannot say which file it was
    scored with; or an older row lacking more of the key), a duplicate and an incomplete last line are removed
    from the file. Nothing is lost: each changed file's original bytes are first saved, fsynced, beside it as
    ``<file>.pre-upgrade-<ns>`` (a name readers and writers ignore), then the file is replaced atomically. Every
    results file is locked like a writer's for the whole upgrade, so a running ``kvbench run`` makes it refuse
    (``dry_run`` takes no lock and writes nothing). A corrupt line anywhere but last refuses the whole directory.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ResultsError(f"{out_dir} is not a results directory (give the --out of a kvbench run)")
    paths = [p for p in sorted(out_dir.glob(RESULTS_GLOB)) if _RESULTS_NAME.fullmatch(p.name) and p.is_file()]
    if not paths:
        raise ResultsError(f"{out_dir} has no results files ({RESULTS_GLOB}); give the --out of a kvbench run")
    locks: list[_Lock] = []
    try:
        for p in [] if dry_run else paths:  # a dry run only reads, like a report
            check_results_file(p)
            lock_path = p.with_name(p.name + ".lock")
            try:
                locks.append(_Lock(lock_path, wait=False))
            except BlockingIOError:
                raise ResultsError(
                    f"{p} is being written by {_Lock.holder(lock_path)}: let that run finish, then upgrade"
                ) from None
        data = {p: _read_bytes(p) for p in paths}
        taken = {row_key(r) for p in paths for r in _scan(data[p], p).rows}  # an upgraded row never displaces one
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
                raise _write_error(backup, e, 0) from None
            _atomic_write(report.path, text)
            report.backup = backup
        return [r for r, _ in reports]
    finally:
        for lock in locks:
            lock.release()
