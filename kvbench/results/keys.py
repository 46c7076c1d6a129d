"""What a results line is: the results file names of a directory, a row's identity (:func:`row_key`, the fields of
:class:`kvbench.rows.RowKey`), how one line is decoded (:func:`loads_row`) and classified (a row, a legacy row of an
older kvbench, or not a row), and :class:`ResultsError`, the error of everything under ``kvbench.results``.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from kvbench.errors import KvbenchError
from kvbench.rows import IDENTITY, Absent, defaults, identity_fields, normal_key

#: Fields of a row's identity that every row kvbench ever wrote has (:class:`kvbench.rows.Absent` NEVER).
LEGACY_KEY: tuple[str, ...] = identity_fields(Absent.NEVER)


#: A row's identity: everything that changes its answer (:class:`kvbench.rows.RowKey` declares each field).
#: :data:`OPTIONAL_KEY` are the fields a row written before them lacks and reads as their default (null).
ROW_KEY: tuple[str, ...] = IDENTITY


OPTIONAL_KEY: tuple[str, ...] = identity_fields(Absent.DEFAULT)


_REQUIRED_KEY = identity_fields(Absent.NEVER, Absent.LEGACY, Absent.UPGRADE_TO_NULL)


#: key fields added later without a default: a row lacking one is a legacy row
NEW_KEY = identity_fields(Absent.LEGACY, Absent.UPGRADE_TO_NULL)


#: key fields ``upgrade_results`` may set to null (in a row of an artifact-free method lacking nothing else)
UPGRADE_TO_NULL_FIELDS = frozenset(identity_fields(Absent.UPGRADE_TO_NULL))


_OPTIONAL_DEFAULTS = defaults(OPTIONAL_KEY)


RESULTS_GLOB = "results*.jsonl"


#: How a ``missing.json`` reason starts when the task ran some items, then stopped at one that cannot run (the
#: runner writes it, the report lists such a task even though it has rows).
ENDED_EARLY = "ends after "


RESULTS_NAME = re.compile(r"results(\.shard-\d+-of-\d+)?\.jsonl")


class ResultsError(KvbenchError):
    """A results directory or file that cannot be used as is; the message names the fix."""


def results_name(shard: tuple[int, int] = (0, 1)) -> str:
    """The results file name of shard ``(i, N)``: ``results.jsonl`` when N == 1."""
    i, n = shard
    return "results.jsonl" if n == 1 else f"results.shard-{i}-of-{n}.jsonl"


_KEY_FIELDS = operator.itemgetter(*ROW_KEY)


def row_key(row: Mapping[str, Any]) -> tuple:
    """The identity of a row: its ROW_KEY fields, ``p`` rounded to ``kvbench.rows.P_DECIMALS`` decimals, the others
    ``str`` (:func:`kvbench.rows.normal_key`)."""
    try:
        values = _KEY_FIELDS(row)
    except KeyError:
        if all(k in row for k in _REQUIRED_KEY):  # a row from before an optional key field: it reads as its default
            return row_key({**row, **{k: v for k, v in _OPTIONAL_DEFAULTS.items() if k not in row}})
        missing = [k for k in _REQUIRED_KEY if k not in row]
        needed = list(_REQUIRED_KEY)
        raise ResultsError(f"row is missing key field(s) {missing}; every row needs all of {needed}") from None
    try:
        return normal_key(values)
    except (TypeError, ValueError):
        raise ResultsError(f"row field p={row['p']!r} is not a number (the kept fraction, e.g. 0.5)") from None


def _is_legacy(row: Mapping[str, Any]) -> bool:
    """A row of an older kvbench: every legacy key field, but not every field of today's key."""
    return all(k in row for k in LEGACY_KEY) and any(k not in row for k in NEW_KEY)


#: what :func:`parse_keyed` returns for a legacy row in place of its key
LEGACY = ()


_decode_json = msgspec.json.Decoder().decode


def loads_row(line: bytes) -> Any:
    """The JSON value of one results line: msgspec's strict RFC 8259 decoder (about 2.5x the standard
    library's speed here), and the standard library's for what it refuses (``NaN``, ``Infinity``, which
    ``json.loads`` reads), so every line means what ``json.loads`` says it means. ValueError when neither reads it."""
    try:
        return _decode_json(line)
    except msgspec.DecodeError:
        return json.loads(line)


def dumps_row_line(row: Mapping[str, Any]) -> bytes:
    """One results line as every writer stores a row: UTF-8 JSON (non-ASCII kept as is) and its newline.
    ValueError for NaN or Infinity (strict JSON, which :func:`loads_row`'s fast decoder reads), TypeError for a
    value JSON has no form for."""
    return (json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def parse_keyed(line: bytes, decode: Callable[[bytes], Any] = loads_row) -> tuple[dict, tuple] | None:
    """``(row, row_key(row))`` for a complete, valid row on one line, ``(row, LEGACY)`` for a legacy row, None
    for anything else. One key computation and one legacy check per row: readers parse millions. ``decode``:
    line -> the row's fields as a dict (default :func:`loads_row`, every field; see :func:`iter_file`)."""
    try:
        row = decode(line)
    except ValueError:
        return None
    if not isinstance(row, dict):
        return None
    try:
        return row, row_key(row)
    except ResultsError:
        return (row, LEGACY) if _is_legacy(row) else None


def legacy_error(path: Path, n: int) -> ResultsError:
    return ResultsError(
        f"{path} holds {n} rows of an older kvbench whose identity lacks some of {', '.join(NEW_KEY)}, so they "
        "could stand for the wrong settings (another prompt length, seed, context, weights or calibration "
        "artifact): run into a new --out directory, or `kvbench results upgrade DIR` to keep the rows that can be "
        "upgraded"
    )
