"""scripts/card_targets.py: per-task means and target verdicts from hand-made result rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _write(directory: Path, rows: list[tuple[str, str, str, float, float]]) -> None:
    directory.mkdir(parents=True)
    lines = [
        json.dumps({"bench": b, "task": t, "method": m, "p": p, "length": 4096, "score": s}) for b, t, m, p, s in rows
    ]
    (directory / "results.jsonl").write_text("\n".join(lines) + "\n")


def test_card_targets_means_and_verdicts(tmp_path):
    five = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "fwe")
    full = [("ruler", t, "full", 1.0, s) for t in five for s in (100.0, 0.0)]  # each task 50
    full[0] = ("ruler", "niah_single_1", "full", 1.0, 100.0)
    full[1] = ("ruler", "niah_single_1", "full", 1.0, 90.0)  # niah_single_1: 95
    _write(tmp_path / "ruler-full", full)
    _write(tmp_path / "ruler-1024", [("ruler", t, "full", 1.0, 40.0) for t in five])  # mean 40
    scb = [("scbench", t, "full", 1.0, 20.0) for t in ("kv", "mf", "prefix_suffix", "vt")]
    scb[0] = ("scbench", "kv", "full", 1.0, 60.0)  # kv 60, mean (60 + 3 * 20) / 4 = 30
    scb.append(("scbench", "kv", "random", 0.1, 20.0))  # a third of full cache's
    _write(tmp_path / "scbench", scb)
    seed43 = [("scbench", t, "full", 1.0, 60.0) for t in ("kv", "mf", "prefix_suffix", "vt")]  # kv 60, mean 60
    seed43.append(("scbench", "kv", "random", 0.1, 36.0))  # 60 % of full cache's
    _write(tmp_path / "scbench-seed43", seed43)
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "card_targets.py"), str(tmp_path), "--before-1024", "44"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "RULER niah_single_1: 95.0 (target >= 95) PASS" in out
    assert "RULER five-task mean: 59.0 (target >= 45) PASS" in out  # (95 + 4 * 50) / 5
    assert "1,024-token five-task mean: 40.0 (target >= 41) MISS by 1.0" in out  # at most 3 below 44
    assert "scbench kv: 60.0 (target >= 60) PASS" in out
    assert "scbench mean of four: 30.0 (target >= 40) MISS by 10.0" in out
    assert "scbench random p=0.1 kv, % of full cache's: 33.3 (target <= 50) PASS" in out
    assert "scbench-seed43 kv: 60.0 (target >= 60) PASS" in out
    assert "scbench-seed43 mean of four: 60.0 (target >= 40) PASS" in out
    assert "scbench-seed43 random p=0.1 kv, % of full cache's: 60.0 (target <= 50) MISS by 10.0" in out


def test_card_targets_says_what_was_not_measured(tmp_path):
    _write(tmp_path / "ruler-full", [("ruler", "niah_single_1", "full", 1.0, 100.0)])
    _write(tmp_path / "ruler-1024", [])
    _write(tmp_path / "scbench", [("scbench", "mf", "full", 1.0, 10.0)])
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "card_targets.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "RULER five-task mean: not measured (target >= 45)" in out
    assert "scbench kv: not measured (target >= 60)" in out
    assert "scbench-seed43: not measured" in out


def test_methods_table_cells_are_per_p_means(tmp_path):
    """docs/methods.md's table: full once, other methods 'p=0.5 / p=0.1', the mean over tasks per p."""
    rows = [
        {"bench": "scbench", "task": t, "method": m, "allocation": a, "p": p, "length": 4096, "score": s}
        for t, m, a, p, s in [
            ("kv", "full", "flat", 1.0, 100.0), ("kv", "full", "flat", 1.0, 50.0), ("mf", "full", "flat", 1.0, 10.0),
            ("kv", "snapkv", "flat", 0.5, 80.0), ("kv", "snapkv", "flat", 0.1, 0.0),
            ("mf", "snapkv", "flat", 0.5, 10.0), ("mf", "snapkv", "flat", 0.1, 5.0),
            ("kv", "oracle", "gate", 0.5, 100.0),
        ]
    ]  # fmt: skip
    (tmp_path / "eviction-scbench").mkdir()
    (tmp_path / "eviction-scbench" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "card_targets.py"), str(tmp_path), "--methods-table", "m"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out[0] == "| m, eviction-scbench | kv | mf | mean |"
    assert out[2] == "| full [flat] | 75 | 10 | 42.5 |"
    assert out[3] == "| snapkv [flat] | 80 / 0 | 10 / 5 | 45 / 2.5 |"
    assert out[4] == "| oracle [gate] (query-aware) | 100 /  |  /  |  /  |"  # missing cells stay empty
