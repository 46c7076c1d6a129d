"""scripts/mf_by_kind.py: generated mf rows grouped by the kind each question asks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import mf_by_kind as M  # noqa: E402

from tests.test_compare_rows import write  # noqa: E402

# Row 0 of generated mf at seed 42 asks, in turn order (read off the generated questions by hand):
ROW0_KINDS = ["third largest number", "median number", "smallest number", "largest number", "second smallest number"]


def row(question: int, prediction: str, label: int, score: float, method: str = "full", **extra) -> dict:
    return {
        "model": "m", "engine": "torch", "method": method, "allocation": "flat", "p": 1.0, "bench": "scbench",
        "task": "mf", "item": "0", "question": str(question), "length": 4096, "seed": 42, "context_sha256": "c",
        "model_fingerprint": "f", "artifact_sha256": None, "source": "generated", "prediction": prediction,
        "references": [str(label)], "score": score, "meta": {"row": 0}, **extra,
    }  # fmt: skip


def test_rows_grouped_by_the_kind_their_question_asks(tmp_path, capsys):
    rows = [row(q, "81", 79 + q, 100.0 if q == 3 else 0.0) for q in range(5)]
    rows.append(row(3, "80", 81, 0.0, method="random"))
    rows.append({**row(0, "1", 1, 100.0), "task": "kv"})  # another task: left out
    rows.append({**row(1, "1", 1, 100.0), "source": "hub", "context_sha256": "h"})  # hub rows: no generator seed
    table = M.by_kind(rows)
    assert set(table) == {("m", "full", "flat", 1.0), ("m", "random", "flat", 1.0)}
    full = table["m", "full", "flat", 1.0]
    assert {kind: [s for s, _, _ in v] for kind, v in full.items()} == {
        kind: [100.0 if q == 3 else 0.0] for q, kind in enumerate(ROW0_KINDS)
    }
    assert table["m", "random", "flat", 1.0] == {"largest number": [(0.0, "80", "81")]}

    assert M.main([str(write(tmp_path / "r", rows)), "--examples", "1"]) == 0
    out = capsys.readouterr().out
    assert "m / full [flat] p=1.0: mf 20.0 (5 questions)" in out
    assert "  largest number          100.0  n=  1  distinct answers   1   81/82" in out
    assert "m / random [flat] p=1.0: mf 0.0 (1 questions)" in out


def test_no_mf_rows_is_an_error_naming_the_directory(tmp_path):
    d = write(tmp_path / "r", [{**row(0, "1", 1, 100.0), "task": "kv"}])
    with pytest.raises(SystemExit, match="no generated SCBench mf rows"):
        M.main([str(d)])
