"""kvbench's import-only torchvision stand-in (kvbench/engines/vllm_stubs), which lets vLLM load text-only
Qwen3.5: every name vLLM's and transformers' vision modules import at module level imports, every use raises
naming the stand-in; installed the way kvbench's vLLM plugin installs it, transformers still reports torchvision
absent (it would otherwise parse the stand-in's missing version and fail, which is how vLLM's model inspection
subprocess broke when the stand-in came in through PYTHONPATH). Each probe runs in a fresh interpreter."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from kvbench.engines.vllm_plugin import STUBS

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


INSTALLED = """
from kvbench.engines.vllm_plugin import use_torchvision_stub
assert use_torchvision_stub() is True
# what vLLM's config and Qwen3.5 modules import: the auto image processors parse torchvision's version at import
import transformers.models.auto.image_processing_auto
from transformers.models.qwen2_vl import Qwen2VLImageProcessor
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize, tvF
from transformers.utils import import_utils
assert not import_utils.is_torchvision_available() and not import_utils.is_torchvision_greater_or_equal("0.1")
assert type(tvF.resize).__name__ == "Missing" and callable(smart_resize)
print("ok")
"""


def _probe(code: str, **env: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="a real torchvision is installed")
def test_installed_stand_in_leaves_transformers_reporting_no_torchvision():
    out = _probe(INSTALLED)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="a real torchvision is installed")
def test_stand_in_on_pythonpath_is_what_breaks_transformers():
    """The failure the plugin avoids (CI, fresh vLLM cache): importable before transformers looks, the stand-in is
    taken for torchvision and its version parse fails. If this ever passes, the freeze is no longer needed."""
    out = _probe("import transformers.models.auto.image_processing_auto", PYTHONPATH=STUBS)
    assert out.returncode != 0 and "Invalid version" in out.stderr, out.stderr[-2000:]


def test_stand_in_is_refused_when_transformers_rechecks(monkeypatch):
    """A transformers that re-checks importability on every call would take the stand-in for torchvision: refused."""
    from transformers.utils import import_utils

    import kvbench.engines.vllm_plugin as P

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != STUBS])
    monkeypatch.setattr(P.importlib.util, "find_spec", lambda name: None)  # no real torchvision anywhere
    monkeypatch.setattr(import_utils, "is_torchvision_available", lambda: STUBS in sys.path)
    with pytest.raises(RuntimeError, match="pose as torchvision"):
        P.use_torchvision_stub()
    assert STUBS not in sys.path


def test_stand_in_is_used_only_without_a_real_torchvision(monkeypatch, tmp_path):
    import kvbench.engines.vllm_plugin as P

    real = tmp_path / "torchvision"
    real.mkdir()
    (real / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *[p for p in sys.path if p != STUBS]])
    assert P.use_torchvision_stub() is False and STUBS not in sys.path
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    assert P.use_torchvision_stub() is True and sys.path[-1] == STUBS


def test_plugin_installs_the_stand_in_only_for_kvbench(monkeypatch):
    """register() is vLLM's entry point in every process (the inspection subprocess too): without the kvbench
    engine's flag it changes nothing; vllm itself is absent here, so the flagged path is covered by tests/vllm."""
    import kvbench.engines.vllm_plugin as P

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != STUBS])
    monkeypatch.delenv(P.ENV_FLAG, raising=False)
    P.register()
    assert STUBS not in sys.path
