"""``load_model(weights=False)``: what an engine that loads the checkpoint itself (vLLM) gets — config, tokenizer
and the same fingerprint as a full load, without a torch copy of the weights."""

from __future__ import annotations

import os

import pytest
import torch

from kvbench import models
from kvbench.models import load_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _no_weights(*args, **kwargs):
    raise AssertionError("the weights were loaded")


def test_weightless_load_has_the_full_loads_fingerprint_and_no_storage(cache, monkeypatch):
    full = load_model("tiny-trained", dtype="bfloat16")
    monkeypatch.setattr(models, "_load_weights", _no_weights)
    light = load_model("tiny-trained", dtype="bfloat16", weights=False)
    assert light.fingerprint == full.fingerprint
    assert all(p.device.type == "meta" for p in light.model.parameters())
    assert light.model.config.to_dict() == full.model.config.to_dict()
    assert light.tokenizer.get_vocab() == full.tokenizer.get_vocab()
    # the fingerprint is per dtype: float32 was never loaded, so it is not known without the weights
    with pytest.raises(AssertionError, match="weights were loaded"):
        load_model("tiny-trained", dtype="float32", weights=False)


def test_a_cold_cache_loads_the_weights_once_then_never(cache, monkeypatch):
    loads = []
    real = models._load_weights
    monkeypatch.setattr(models, "_load_weights", lambda *a: loads.append(a) or real(*a))
    first = load_model("tiny-trained-dense", dtype="bfloat16", weights=False)
    second = load_model("tiny-trained-dense", dtype="bfloat16", weights=False)
    assert len(loads) == 1 and first.fingerprint == second.fingerprint
    monkeypatch.setattr(models, "_load_weights", real)
    assert first.fingerprint == load_model("tiny-trained-dense", dtype="bfloat16").fingerprint


def test_rewritten_weights_are_fingerprinted_again(cache, tmp_path, monkeypatch):
    import shutil

    src = models.materialize_builtin("tiny-trained-dense")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(src, ckpt)
    before = load_model(str(ckpt), dtype="bfloat16", weights=False).fingerprint
    model = load_model(str(ckpt), dtype="bfloat16").model
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    model.save_pretrained(ckpt)
    weights = ckpt / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    after = load_model(str(ckpt), dtype="bfloat16", weights=False).fingerprint
    assert after != before
    assert after == load_model(str(ckpt), dtype="bfloat16").fingerprint
