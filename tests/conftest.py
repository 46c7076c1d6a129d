"""Shared fixtures: tiny random hybrids of both families, built in code (no download)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import NoReturn

import pytest
import torch

# Built-in models are materialised under the kvbench cache: keep the suite's cache private.
os.environ.setdefault("KVBENCH_CACHE", tempfile.mkdtemp(prefix="kvbench-test-cache-"))
# Real data files for integration tests live in ../shared/data beside the checkout (when present).
_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if "KVBENCH_DATA_DIR" not in os.environ and _SHARED_DATA.is_dir():
    os.environ["KVBENCH_DATA_DIR"] = str(_SHARED_DATA)
torch.set_num_threads(min(2, torch.get_num_threads()))
#: Set to 1 where the shared data is known to be there (CI: ``.ci/run``): a test that would skip for a missing
#: shared data file fails instead, so the checks that read it cannot silently switch off.
REQUIRE_DATA_ENV = "KVBENCH_REQUIRE_DATA"


def missing_data(reason: str) -> NoReturn:
    """Skip the calling test because shared data is absent (``reason`` names the file), or fail it when
    ``KVBENCH_REQUIRE_DATA=1``."""
    if os.environ.get(REQUIRE_DATA_ENV) == "1":
        pytest.fail(f"{reason}; {REQUIRE_DATA_ENV}=1 requires it (put it there or unset the variable)", pytrace=False)
    pytest.skip(reason)


from kvbench.engines.torch_engine import TorchEngine  # noqa: E402
from kvbench.models import build_random, tiny_qwen3_5_config, tiny_qwen3_next_config  # noqa: E402

FAMILIES = {
    "qwen3_next": lambda: tiny_qwen3_next_config(),
    "qwen3_next_moe": lambda: tiny_qwen3_next_config(moe=True),
    "qwen3_5": lambda: tiny_qwen3_5_config(),
}
_MODELS: dict[str, torch.nn.Module] = {}


def tiny_model(family: str) -> torch.nn.Module:
    """A seeded random tiny model of ``family`` (cached for the session; never mutated by tests)."""
    if family not in _MODELS:
        _MODELS[family] = build_random(FAMILIES[family](), seed=0)
    return _MODELS[family]


@pytest.fixture(params=sorted(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture
def engine(family) -> TorchEngine:
    return TorchEngine(tiny_model(family))


@pytest.fixture
def one_thread():
    """One intra-op thread for tests made of many small ops (oversubscription on small shared machines)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["kernel", "sdpa"])
def decode_path(request, monkeypatch) -> str:
    """Decoding steps attended by kvbench's decode-attention kernel, or by SDPA (``KVBENCH_DECODE_KERNEL=0``)."""
    from kvbench.engines import decode_kernel

    if request.param == "sdpa":
        monkeypatch.setenv("KVBENCH_DECODE_KERNEL", "0")
    else:
        monkeypatch.delenv("KVBENCH_DECODE_KERNEL", raising=False)
    decode_kernel._load.cache_clear()
    if request.param == "kernel" and not decode_kernel.available():
        pytest.skip(f"optional: the decode-attention kernel cannot be built here ({decode_kernel.status()})")
    yield request.param
    decode_kernel._load.cache_clear()
