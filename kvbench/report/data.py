"""Result rows -> one pandas DataFrame with the columns every report view uses.

``load(dirs)`` reads every ``results*.jsonl`` and the ``missing.json`` of each directory, read-only: an
incomplete last line (a writer interrupted mid-row) is skipped and said so in the notes; a bad line anywhere
else is an error naming the file and line. Rows are parsed one by one into columns (the prediction, references
and meta fields are not kept), so a paper-sized sweep (1.4 M rows) fits in a few hundred MB.

``frame(rows)`` turns row dicts into the same DataFrame. Its columns:

* identity: ``model, engine, bench, task, method, allocation, item, question`` (categorical str), ``p`` (float,
  rounded to 4 decimals), ``model_fingerprint, context_sha256`` (str, ``""`` when not recorded), ``length`` and
  ``seed`` (str, ``"n/a"`` when not recorded: older rows lack ``length``);
* ``label``: ``"method [allocation]"``, plus `` {option=value,…}`` for rows run with non-default method options;
* scores (0–100): ``score`` (the row's primary scorer), ``score_official`` and ``score_revised`` (equal where the
  scorer has no revision), ``sub`` (the sub-task of a mixed SCBench task, ``""`` elsewhere), ``scorer``;
* flags: ``real_fork``, ``query_aware``, ``random_weights`` (bool);
* measurements: ``stored_bytes, full_bytes, n_context`` (float), ``prefill_s, score_s`` (seconds).
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import KvbenchError

__all__ = ["COLUMNS", "SETTING", "frame", "load", "load_manifests", "setting_title", "usable"]

#: A comparable setting: rows of one (model, weights, engine, bench, prompt length, seed) are compared.
SETTING = ["model", "model_fingerprint", "engine", "bench", "length", "seed"]
_STR = ["model", "engine", "bench", "task", "method", "allocation", "item", "question", "model_fingerprint",
        "context_sha256", "length", "seed", "label", "scorer", "sub"]  # fmt: skip
_FLOAT = ["p", "score", "score_official", "score_revised", "stored_bytes", "full_bytes", "n_context", "prefill_s",
          "score_s"]  # fmt: skip
_BOOL = ["real_fork", "query_aware", "random_weights"]
COLUMNS = [*_STR, *_FLOAT, *_BOOL]
REVISED = "_revised"


class _Columns:
    """Column buffers filled row by row; repeated strings are stored once (interned through a dict)."""

    def __init__(self) -> None:
        self.str = {c: [] for c in _STR}
        self.float = {c: array("d") for c in _FLOAT}
        self.bool = {c: bytearray() for c in _BOOL}
        self._intern: dict[str, str] = {}

    def _s(self, value: object, missing: str = "") -> str:
        text = missing if value is None else str(value)
        return self._intern.setdefault(text, text)

    def add(self, row: dict) -> None:
        """Append the report's fields of one result row."""
        s, f, b = self.str, self.float, self.bool
        for c in ("model", "engine", "bench", "task", "method", "allocation", "item", "question"):
            s[c].append(self._s(row.get(c)))
        for c in ("model_fingerprint", "context_sha256"):
            s[c].append(self._s(row.get(c)))
        s["length"].append(self._s(row.get("length"), "n/a"))
        s["seed"].append(self._s(row.get("seed"), "n/a"))
        options = row.get("method_options")
        label = f"{row.get('method')} [{row.get('allocation')}]"
        if options:
            label += " {" + ",".join(f"{k}={v}" for k, v in sorted(dict(options).items())) + "}"
        s["label"].append(self._s(label))
        scorer = str(row.get("scorer") or "")
        s["scorer"].append(self._s(scorer))
        s["sub"].append(self._s(_sub_task(str(row.get("task")), scorer)))
        score = _num(row.get("score"))
        official, revised = _official_revised(score, scorer, row.get("scores") or {})
        f["p"].append(round(_num(row.get("p")), 4))
        f["score"].append(score)
        f["score_official"].append(official)
        f["score_revised"].append(revised)
        for c in ("stored_bytes", "full_bytes", "n_context", "prefill_s", "score_s"):
            f[c].append(_num(row.get(c)))
        b["real_fork"].append(bool(row.get("real_fork", True)))
        b["query_aware"].append(bool(row.get("query_aware", False)))
        b["random_weights"].append(bool(row.get("random_weights", False)))

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


def _sub_task(task: str, scorer: str) -> str:
    """The sub-task a mixed SCBench task's scorer names (``scbench_repoqa_and_kv_kv`` -> ``kv``), else ``""``."""
    name = scorer.removesuffix(REVISED)
    prefix = f"scbench_{task}_"
    return name[len(prefix) :] if name.startswith(prefix) else ""


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
    return cols.frame()


def _read_jsonl(path: Path, cols: _Columns, notes: list[str]) -> None:
    """Parse one results file into ``cols``; skip (and note) an incomplete last line."""
    with open(path, "rb") as fh:
        data = fh.read()
    lines = data.split(b"\n")
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
        except ValueError:
            if i == last or (i == last - 1 and not lines[last]):
                notes.append(f"skipped an incomplete last line in {path} ({len(line)} bytes: an interrupted write)")
                continue
            raise KvbenchError(
                f"{path}: line {i + 1} is not a valid result row; fix or delete that line (the report only reads)"
            ) from None
        cols.add(row)


def load(dirs: Path | Sequence[Path]) -> tuple[pd.DataFrame, dict[str, str], list[str]]:
    """Every ``results*.jsonl`` row of ``dirs`` (read-only, duplicates across files kept once), the merged
    ``missing.json`` (``"bench/task" -> reason``) and notes on what was skipped."""
    dirs = [Path(dirs)] if isinstance(dirs, (str, Path)) else [Path(d) for d in dirs]
    cols, missing, notes = _Columns(), {}, []
    for d in dirs:
        files = sorted(d.glob("results*.jsonl"))
        if not files:
            raise KvbenchError(f"no results in {d}: run `kvbench run --out {d}` first")
        for path in files:
            _read_jsonl(path, cols, notes)
        path = d / "missing.json"
        if path.exists():
            try:
                found = json.loads(path.read_bytes())
            except ValueError:
                raise KvbenchError(f"{path} is corrupt; delete it (the next run rewrites it)") from None
            if isinstance(found, dict):
                missing.update({str(k): str(v) for k, v in found.items()})
    df = cols.frame()
    key = ["model", "model_fingerprint", "engine", "method", "allocation", "label", "p", "bench", "task", "item",
           "question", "length", "seed", "context_sha256"]  # fmt: skip
    dup = df.duplicated(key)
    if dup.any():
        notes.append(f"{int(dup.sum())} rows appear in more than one results file; each was counted once")
        df = df[~dup].reset_index(drop=True)
    return df, missing, notes


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


def setting_title(key: Sequence[str]) -> str:
    """A section header for one SETTING tuple: ``model (fingerprint) · engine · bench · length L · seed S``."""
    model, fingerprint, engine, bench, length, seed = key
    weights = f" ({fingerprint[:12]})" if fingerprint else ""
    return f"{model}{weights} · {engine} · {bench} · length {length} · seed {seed}"
