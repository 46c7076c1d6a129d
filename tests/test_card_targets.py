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
    full += [("ruler", "niah_single_1", "random", 0.1, 40.0)] * 2  # loss 55
    _write(tmp_path / "ruler-full", full)
    _write(tmp_path / "ruler-1024", [("ruler", t, "full", 1.0, 40.0) for t in five])  # mean 40
    scb = [("scbench", t, "full", 1.0, 20.0) for t in ("kv", "mf", "prefix_suffix", "vt")]
    scb[0] = ("scbench", "kv", "full", 1.0, 60.0)  # kv 60, mean (60 + 3 * 20) / 4 = 30
    scb.append(("scbench", "kv", "random", 0.1, 20.0))  # loss 40
    _write(tmp_path / "scbench", scb)
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "card_targets.py"), str(tmp_path), "--before-1024", "46"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "RULER niah_single_1: 95.0 (target >= 95) PASS" in out
    assert "RULER five-task mean: 59.0 (target >= 45) PASS" in out  # (95 + 4 * 50) / 5
    assert "SCBench kv: 60.0 (target >= 50) PASS" in out
    assert "SCBench mean of four: 30.0 (target >= 30) PASS" in out
    assert "1,024-token five-task mean: 40.0 (target >= 41) MISS by 1.0" in out
    assert "random p=0.1 loss on niah_single_1: 55.0 (target >= 50) PASS" in out
    assert "random p=0.1 loss on SCBench kv: 40.0 (target >= 50) MISS by 10.0" in out
