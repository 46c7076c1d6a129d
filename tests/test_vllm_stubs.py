"""kvbench's import-only torchvision stand-in (kvbench/engines/vllm_stubs), which lets vLLM load text-only
Qwen3.5: every name vLLM's and transformers' vision modules import at module level imports, every use raises
naming the stand-in. Run in a subprocess with the stand-in on PYTHONPATH, as vLLM's model inspection subprocess
sees it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from kvbench.engines.vllm_engine import STUBS

PROBE = """
import torchvision.transforms.v2.functional as tvF
from torchvision.transforms.v2 import functional
from torchvision import io as torchvision_io
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import InterpolationMode
from torchvision.transforms.functional import pil_to_tensor
assert InterpolationMode.BICUBIC != InterpolationMode.BILINEAR and ImageReadMode.RGB.name == "RGB"
for use in (lambda: tvF.resize(1, 2), lambda: decode_image(b""), lambda: functional.normalize.something(),
            lambda: pil_to_tensor(None), lambda: torchvision_io.read_image("x")):
    try:
        use()
    except ModuleNotFoundError as e:
        assert "import-only stand-in" in str(e), e
    else:
        raise SystemExit("a stand-in name ran")
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="a real torchvision is installed")
def test_stand_in_imports_and_refuses_every_use():
    env = {**os.environ, "PYTHONPATH": STUBS}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_stand_in_is_used_only_without_a_real_torchvision(monkeypatch, tmp_path):
    import kvbench.engines.vllm_engine as V

    real = tmp_path / "torchvision"
    real.mkdir()
    (real / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *[p for p in sys.path if p != STUBS]])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert V.use_torchvision_stub() is False and STUBS not in sys.path and "PYTHONPATH" not in os.environ
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    assert V.use_torchvision_stub() is True
    assert sys.path[-1] == STUBS and os.environ["PYTHONPATH"] == STUBS
