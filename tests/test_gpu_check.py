"""Without a GPU: the GPU check and ``--device cuda`` say so in one line, exit 2, and load nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or shutil.which("nvidia-smi") is not None, reason="this machine has a GPU"
)


def test_gpu_check_exits_2_in_one_line(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "no NVIDIA GPU" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("engine", ["vllm", "torch"])
def test_device_cuda_without_cuda_is_one_line_before_loading(tmp_path, engine):
    cmd = [sys.executable, "-c", "from kvbench.cli import main; main()", "run", "--engine", engine, "--device",
           "cuda", "--method", "snapkv", "--bench", "ruler", "--limit", "1", "--out", str(tmp_path / "r")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert lines == ["error: --device cuda: CUDA is not available on this machine; use --device cpu"]
    assert not (tmp_path / "r" / "results.jsonl").exists()
