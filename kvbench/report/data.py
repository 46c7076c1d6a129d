"""Result rows -> one pandas DataFrame with the columns every report view uses.

``load(dirs)`` reads every results file and ``missing.json`` of each directory through
:func:`kvbench.results.iter_results` (read-only; its rules for cut lines, legacy rows and duplicates). Rows are
parsed one by one into columns (the prediction, references and meta fields are not kept), so a paper-sized sweep
(1.4 M rows) fits in a few hundred MB.

``frame(rows)`` turns row dicts into the same DataFrame. Its columns take their names and kinds from
:mod:`kvbench.rows` (:func:`kvbench.rows.column_kind`: a ``str`` column is categorical, a number float, NaN where
absent, a flag bool):

* identity, the text of :func:`kvbench.results.row_key`: every :class:`kvbench.rows.RowKey` field (``model,
  engine, method, allocation, bench, task, item, question, length, seed, context_sha256, model_fingerprint,
  artifact_sha256, source``: categorical ``str`` of the field's value, ``"None"`` for null) and ``p`` (float,
  rounded to 4 decimals); for a field absent from the row (only :func:`frame` meets such rows) ``""``, ``"n/a"``
  for ``length`` and ``seed``, the text of its default for a field that has one (``"None"`` for ``source``);
* ``label``: ``"method [allocation]"`` (rows run with non-default method options have the method
  ``METHOD[OPTION=VALUE,…]``, so they get labels of their own). Where rows of one method in one setting were
  scored with more than one artifact (directories of two calibrations read together), ``method`` becomes
  ``METHOD@SHA`` (the digest's first 8 hex digits) and the label follows, so they are never averaged together;
* scores (0–100): ``score`` (the row's primary scorer), ``score_official`` and ``score_revised`` (equal where the
  scorer has no revision), ``sub`` (the sub-task of a mixed task, as its bench's :meth:`~kvbench.tasks.Bench.sub_task`
  names it from the scorer; ``""`` elsewhere), ``scorer``;
* ``default_allocation``: the allocation the row's method declares as its default (``""`` in rows of a kvbench
  that did not record it);
* flags: ``real_fork``, ``query_aware``, ``random_weights`` (bool);
* measurements: ``stored_bytes, full_bytes, n_context`` (float), ``prefill_s, score_s`` (seconds).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import sys
from array import array
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from kvbench.results.keys import loads_row
from kvbench.results.read import FileStats, ResultsRead, duplicates_note, file_spans, iter_file, results_files
from kvbench.rows import IDENTITY, P_DECIMALS, column_kind, defaults

__all__ = ["COLUMNS", "SETTING", "frame", "load", "load_manifests", "setting_title", "usable"]

#: A comparable setting: rows of one (model, weights, engine, bench, source, prompt length, seed) are compared;
#: ``source`` keeps a bench's generated items (SCBench offline) apart from its hub items ("None": one source).
SETTING = ["model", "model_fingerprint", "engine", "bench", "source", "length", "seed"]
#: the row fields the report reads besides the identity
_READ = (
    "scorer",
    "default_allocation",
    "score",
    "stored_bytes",
    "full_bytes",
    "n_context",
    "prefill_s",
    "score_s",
    "real_fork",
    "query_aware",
    "random_weights",
)
#: the columns it derives: the label, a mixed task's sub-task, the official and revised scores
_DERIVED = {"label": "str", "sub": "str", "score_official": "float", "score_revised": "float"}
_KIND = {**{c: column_kind(c) for c in (*IDENTITY, *_READ)}, **_DERIVED}
_STR = [c for c, kind in _KIND.items() if kind == "str"]
_FLOAT = [c for c, kind in _KIND.items() if kind == "float"]
_BOOL = [c for c, kind in _KIND.items() if kind == "bool"]
COLUMNS = [*_STR, *_FLOAT, *_BOOL]
#: (index in kvbench.rows.IDENTITY, column) of the key's str columns (``p`` is a float column)
_KEY_STR = [(i, c) for i, c in enumerate(IDENTITY) if _KIND[c] == "str"]
_KEY_P, _KEY_METHOD, _KEY_ALLOCATION, _KEY_BENCH, _KEY_TASK = (
    IDENTITY.index(c) for c in ("p", "method", "allocation", "bench", "task")
)
#: measurements read as they are (float, NaN where absent)
_MEASURED = [c for c in _READ if _KIND[c] == "float" and c != "score"]
#: the text of an identity field a row lacks, and the value of an absent flag
_MISSING = {"length": "n/a", "seed": "n/a", **{c: str(v) for c, v in defaults(IDENTITY).items()}}
_ABSENT_FLAG = {"real_fork": True, "query_aware": False, "random_weights": False}
REVISED = "_revised"


class _Columns:
    """Column buffers filled row by row; repeated strings are stored once (interned through a dict)."""

    def __init__(self) -> None:
        self.str = {c: [] for c in _STR}
        self.float = {c: array("d") for c in _FLOAT}
        self.bool = {c: bytearray() for c in _BOOL}
        self._intern: dict[str, str] = {}
        self._subs: dict[tuple[str, str, str], str] = {}  # (bench, task, scorer) -> sub-task

    def _s(self, value: object) -> str:
        text = str(value)
        return self._intern.setdefault(text, text)

    def _sub_task(self, bench: str, task: str, scorer: str) -> str:
        """:func:`_sub_task`, asked once per (bench, task, scorer)."""
        if (bench, task, scorer) not in self._subs:
            self._subs[bench, task, scorer] = self._s(_sub_task(bench, task, scorer))
        return self._subs[bench, task, scorer]

    def add(self, row: dict) -> None:
        """Append the report's fields of one result row (fields it lacks get their documented default)."""
        key = tuple(
            round(_num(row.get("p")), P_DECIMALS) if c == "p" else self._s(row[c]) if c in row else _MISSING.get(c, "")
            for c in IDENTITY
        )
        self.add_keyed(key, row)

    def add_keyed(self, key: tuple, row: dict) -> None:
        """Append one row whose :func:`kvbench.results.row_key` is known (as :func:`kvbench.results.iter_file`
        yields it; ``p`` a float): the identity columns and the label come from the key's text, the rest from
        the row."""
        s, f, b = self.str, self.float, self.bool
        for i, c in _KEY_STR:
            s[c].append(key[i])
        method, allocation, task = key[_KEY_METHOD], key[_KEY_ALLOCATION], key[_KEY_TASK]
        s["label"].append(self._s(f"{method} [{allocation}]"))
        scorer = row.get("scorer")
        scorer = self._s(scorer if isinstance(scorer, str) else str(scorer or ""))
        s["scorer"].append(scorer)
        s["sub"].append(self._sub_task(key[_KEY_BENCH], task, scorer))
        default = row.get("default_allocation")
        s["default_allocation"].append(self._s(default) if isinstance(default, str) else "")
        score = _num(row.get("score"))
        official, revised = _official_revised(score, scorer, row.get("scores") or {})
        f["p"].append(float(key[_KEY_P]))
        f["score"].append(score)
        f["score_official"].append(official)
        f["score_revised"].append(revised)
        get = row.get
        for c in _MEASURED:
            f[c].append(_num(get(c)))
        for c in _BOOL:
            b[c].append(bool(get(c, _ABSENT_FLAG[c])))

    def frame(self) -> pd.DataFrame:
        data: dict[str, object] = {c: pd.Categorical(v) for c, v in self.str.items()}
        data.update({c: np.frombuffer(v, dtype=np.float64) if len(v) else np.zeros(0) for c, v in self.float.items()})
        data.update({c: np.frombuffer(bytes(v), dtype=np.uint8).astype(bool) for c, v in self.bool.items()})
        return pd.DataFrame(data, columns=COLUMNS)


def _num(value: object) -> float:
    """A float, NaN for an absent or non-numeric value."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _sub_task(bench: str, task: str, scorer: str) -> str:
    """The sub-task of ``task`` a row of ``bench`` scored by ``scorer`` belongs to, ``""`` for none, as the bench
    names it (:meth:`kvbench.tasks.Bench.sub_task`). Rows of a bench not registered here ask every registered
    bench (the first that names one), as the report read them before benches named their sub-tasks."""
    from kvbench.tasks import BENCHES

    names = [bench] if bench in BENCHES else BENCHES.names()
    return next((sub for name in names if (sub := BENCHES.get(name).sub_task(task, scorer))), "")


def _official_revised(score: float, scorer: str, scores: dict) -> tuple[float, float]:
    """(official, revised) scores of a row: the two names ``X`` / ``X_revised`` of its ``scores``; the primary
    score for both where no revision was recorded."""
    if scorer.endswith(REVISED):
        return _num(scores.get(scorer.removesuffix(REVISED), score)), score
    return score, _num(scores.get(scorer + REVISED, score))


def frame(rows: Iterable[dict]) -> pd.DataFrame:
    """Row dicts -> the report DataFrame (columns in the module docstring); fields absent from a row get
    their documented default."""
    cols = _Columns()
    for row in rows:
        cols.add(row)
    return _split_artifacts(cols.frame())[0]


def load(dirs: Path | Sequence[Path], workers: int | None = None) -> tuple[pd.DataFrame, dict[str, str], list[str]]:
    """Every distinct row of ``dirs`` as the report DataFrame, the merged ``missing.json``
    (``"bench/task" -> reason``) and notes on what was skipped: the rows, notes and order of
    :func:`kvbench.results.iter_results` (read-only, first occurrence of each key wins), streamed into columns.

    Large files are cut into line-aligned byte spans parsed by ``workers`` processes (default: one per CPU core
    available, at most 8; 1 parses here); the spans' columns are joined in file order and rows whose key an
    earlier one had are dropped, as :func:`kvbench.results.iter_results` drops them.
    """
    read = ResultsRead()
    jobs = []
    for path in results_files(dirs, read):
        size = path.stat().st_size
        spans = file_spans(path, size, max(1, -(-size // SPAN_BYTES)))
        jobs += [(path, span, i == len(spans) - 1) for i, span in enumerate(spans)]
    workers = _workers(workers, sum(end - start for _, (start, end), _ in jobs))
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(workers, mp_context=mp_context()) as pool:
            parts = list(pool.map(_read_span, jobs))
    else:
        parts = [_read_span(job) for job in jobs]
    stats: dict[Path, FileStats] = {}
    for (path, _, _), (_, part_stats) in zip(jobs, parts, strict=True):
        stats.setdefault(path, FileStats()).add(part_stats)
    for path, file_stats in stats.items():
        read.notes += file_stats.notes(path)
    df = _concat([part for part, _ in parts])
    duplicated = df.duplicated(subset=list(IDENTITY), keep="first").to_numpy() if len(df) else np.zeros(0, bool)
    if duplicated.any():
        df = df[~duplicated].reset_index(drop=True)
        read.notes.append(duplicates_note(int(duplicated.sum())))
    df, notes = _split_artifacts(df)
    return df, read.missing, read.notes + notes


def _split_artifacts(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Tell apart the rows of one method and setting scored with different artifacts: their ``method`` gets
    ``@`` and the digest's first 8 hex digits, their label follows; one note per method so split."""
    if df.empty:
        return df, []
    keys = [*SETTING, "method"]
    counts = df.groupby(keys, observed=True, sort=False)["artifact_sha256"].nunique()
    split = counts[counts > 1]
    if split.empty:
        return df, []
    notes = []
    method, label = df["method"].astype(str).to_numpy(dtype=object), df["label"].astype(str).to_numpy(dtype=object)
    sha = df["artifact_sha256"].astype(str).to_numpy(dtype=object)
    allocation = df["allocation"].astype(str).to_numpy(dtype=object)
    index = df.set_index(keys).index
    for key in split.index:
        rows = np.flatnonzero(index.isin([key]))
        digests = sorted(set(sha[rows]))
        for i in rows:
            method[i] = f"{method[i]}@{'none' if sha[i] == 'None' else sha[i][:8]}"
            label[i] = f"{method[i]} [{allocation[i]}]"
        notes.append(
            f"rows of {key[-1]} ({setting_title(key[:-1])}) were scored with {len(digests)} different artifacts "
            f"({', '.join(d[:8] for d in digests)}, e.g. before and after a recalibration): shown apart as "
            f"{', '.join(sorted(set(method[rows])))}"
        )
    df = df.copy()
    df["method"], df["label"] = pd.Categorical(method), pd.Categorical(label)
    return df, notes


#: bytes of a results file parsed by one worker task (a 1.4 M-row sweep is about 1.4 GB)
SPAN_BYTES = 32 << 20
#: below this many bytes in all, one process parses everything (a pool's start-up would cost more)
PARALLEL_BYTES = 64 << 20


def cpu_workers() -> int:
    """Worker processes for the report's parallel parts: the CPU cores this process may use, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores))


def _workers(workers: int | None, total_bytes: int) -> int:
    if workers is not None:
        return max(1, workers)
    return 1 if total_bytes < PARALLEL_BYTES else cpu_workers()


def mp_context():
    """``fork`` where it is the platform's safe default (Linux: no re-import in each worker), else ``spawn``."""
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


#: the fields of a row the report reads (its key's, then :class:`_Columns`'); a row's other fields (prediction,
#: references, meta, …) are skipped by the decoder, never built as Python objects
_FIELDS = (*IDENTITY, "scores", *_READ)
_ReportFields = msgspec.defstruct("_ReportFields", [(f, Any, msgspec.UNSET) for f in _FIELDS])
_decode_fields = msgspec.json.Decoder(_ReportFields).decode


def _decode_report_row(line: bytes) -> dict:
    """The report's fields of one results line, as a dict holding those the row has (about 4x faster than
    decoding every field); a line msgspec's strict decoder refuses goes through
    :func:`kvbench.results.loads_row`, so every line reads as it does for :func:`kvbench.results.iter_results`."""
    try:
        obj = _decode_fields(line)
    except msgspec.DecodeError:
        return loads_row(line)
    unset = msgspec.UNSET
    return {f: v for f, v in zip(_FIELDS, msgspec.structs.astuple(obj), strict=True) if v is not unset}


def _read_span(job: tuple[Path, tuple[int, int], bool]) -> tuple[pd.DataFrame, FileStats]:
    """One span of one results file -> its rows' DataFrame (duplicates within the span dropped later, with the
    rest) and what it left out."""
    path, span, last = job
    stats = FileStats()
    cols = _Columns()
    for key, row in iter_file(path, stats, span, last, decode=_decode_report_row):
        cols.add_keyed(key, row)  # strings shared or not, the categorical columns store each once
    return cols.frame(), stats


def _concat(parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Frames of the same columns, one after another; categorical columns keep the union of categories."""
    parts = [part for part in parts if len(part)]  # an empty one's categories have no dtype to unite
    if not parts:
        return _Columns().frame()
    if len(parts) == 1:
        return parts[0]
    data = {}
    for c in COLUMNS:
        if c in _STR:
            data[c] = union_categoricals([part[c] for part in parts], sort_categories=True)  # as frame()
        else:
            data[c] = np.concatenate([part[c].to_numpy() for part in parts])
    return pd.DataFrame(data, columns=COLUMNS)


def load_manifests(dirs: Sequence[Path]) -> list[dict]:
    """The run entries of every ``manifest.json`` of ``dirs`` (an unreadable manifest is skipped)."""
    runs: list[dict] = []
    for d in dirs:
        path = Path(d) / "manifest.json"
        try:
            manifest = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        runs += [r for r in manifest.get("runs", []) if isinstance(r, dict)] if isinstance(manifest, dict) else []
    return runs


def usable(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that enter comparisons: real compacted forks (``real_fork`` false rows are left out)."""
    return df[df.real_fork]


def bench_label(bench: str, source: str, tasks: Sequence[str] = ()) -> str:
    """How a section names its bench: the bench's title (:func:`kvbench.tasks.bench_title`), and for generated
    items of a bench with more than one source ``"<title> (generated offline: <tasks>)"`` (no list without
    ``tasks``)."""
    from kvbench.tasks import bench_title

    title = bench_title(bench)
    if source == "generated":
        return (
            f"{title} (generated offline: {', '.join(sorted(map(str, tasks)))})"
            if tasks
            else f"{title} (generated offline)"
        )
    return title


def setting_title(key: Sequence[str], tasks: Sequence[str] = ()) -> str:
    """A section header for one SETTING tuple: ``model (fingerprint) · engine · bench · length L · seed S``
    (``tasks``: the section's tasks, named for generated items, see :func:`bench_label`)."""
    model, fingerprint, engine, bench, source, length, seed = key
    weights = f" ({fingerprint[:12]})" if fingerprint else ""
    return f"{model}{weights} · {engine} · {bench_label(bench, source, tasks)} · length {length} · seed {seed}"
