"""scripts/gpu_check.py's isolation: every part in its own process, a raising part keeps the others' records and
fails the verdict, a vLLM part that cannot run fails it unless allowed (tests/test_gpu_check.py: without a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "scripts" / "gpu_check.py"


def _check(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[int, dict]:
    out = tmp_path / "check"
    done = subprocess.run([sys.executable, str(CHECK), "--device", "cpu", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})  # fmt: skip
    return done.returncode, json.loads((out / "gpu_check.json").read_text())


def test_a_raising_part_keeps_the_other_records_and_fails_the_verdict(tmp_path):
    rc, verdict = _check(tmp_path, "--parts", "torch_engine/tiny-trained-dense,fast_kernels",
                         env={"KVBENCH_GPU_CHECK_RAISE": "torch_engine/tiny-trained-dense"})  # fmt: skip
    parts = verdict["parts"]
    assert rc == 1 and verdict["ok"] is False
    assert parts["torch_engine/tiny-trained-dense"]["ok"] is False
    assert "made to raise" in parts["torch_engine/tiny-trained-dense"]["error"]
    fast = parts["fast_kernels"]  # ran after the raise, in its own process, and recorded in full
    assert fast["ok"] is True and fast["all_identical"] is True and fast["fla_imported"] is True
    assert (tmp_path / "check" / "parts" / "fast_kernels.json").is_file()


def test_a_hanging_part_is_killed_with_its_children_and_the_next_part_runs(tmp_path):
    """Past its limit a part's whole process group is killed (a part's own child would otherwise outlive it and
    hold the memory the next part needs); the part is recorded as timed out and the verdict fails."""
    rc, verdict = _check(tmp_path, "--parts", "fast_kernels,vllm", "--limit-scale", "0.1",
                         "--vllm-python", str(tmp_path / "no-python"),
                         env={"KVBENCH_GPU_CHECK_HANG": "fast_kernels"})  # fmt: skip
    assert rc == 1 and verdict["ok"] is False
    fast = verdict["parts"]["fast_kernels"]  # limit 300 s x 0.1 (a part with under 20 s left is not started)
    assert fast["ok"] is False and fast["status"] == "timed out after 30 s"
    pid = int((tmp_path / "check" / "hang.pid").read_text())
    alive = Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert not alive, "the hanging part's child outlived it"
    assert all(p["status"] == "not run" for n, p in verdict["parts"].items() if n.startswith("vllm"))


def test_a_vllm_part_that_cannot_run_fails_unless_allowed(tmp_path):
    rc, verdict = _check(tmp_path, "--parts", "vllm", "--vllm-python", str(tmp_path / "no-python"))
    assert rc == 1 and verdict["ok"] is False
    assert set(verdict["parts"]) == {"vllm/qwen3_5", "vllm/qwen3_next", "vllm_hnd/qwen3_5"}
    assert all(p["status"] == "not run" and "no vLLM python" in p["why"] for p in verdict["parts"].values())
    # allowed: recorded as not run, not counted; nothing else ran, so there is nothing to pass either
    rc, verdict = _check(tmp_path, "--parts", "vllm", "--vllm-python", str(tmp_path / "no-python"),
                         "--allow-missing", "vllm")  # fmt: skip
    assert all(p["ok"] is None for p in verdict["parts"].values()) and verdict["ok"] is False and rc == 1


def test_an_unknown_part_is_refused_by_name(tmp_path):
    done = subprocess.run([sys.executable, str(CHECK), "--device", "cpu", "--out", str(tmp_path), "--parts", "gpu"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode != 0 and "names no part" in done.stderr
