"""scripts/compare_rows.py: rows paired by identity; only timing fields may differ."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvbench.rows import IDENTITY

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import compare_rows as C  # noqa: E402


def write(directory: Path, rows: list[dict]) -> Path:
    directory.mkdir()
    (directory / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


def row(i: int, **extra) -> dict:
    return {**{f: f"{f}-{i}" for f in IDENTITY}, "score": 100.0, "prefill_s": 0.5, **extra}


def test_timings_aside_the_same_rows_pass_and_anything_else_fails(tmp_path, capsys):
    a = write(tmp_path / "a", [row(0), row(1)])
    assert C.main([str(a), str(write(tmp_path / "b", [row(1, prefill_s=9.0), row(0)]))]) == 0
    assert "same rows, timings aside" in capsys.readouterr().out
    assert C.main([str(a), str(write(tmp_path / "c", [row(0), row(1, score=0.0)]))]) == 1
    assert "score: differs in 1 rows  <- not a timing" in capsys.readouterr().out
    assert C.main([str(a), str(write(tmp_path / "d", [row(0)]))]) == 1
    assert "only in A 1" in capsys.readouterr().out
