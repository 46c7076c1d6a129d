"""``load_model(weights=False)``: what an engine that loads the checkpoint itself (vLLM) gets — config, tokenizer
and the same fingerprint as a full load, without a torch copy of the weights."""

from __future__ import annotations

import os

import pytest
import torch

from kvbench import models
from kvbench.checkpoints.files import canonical_config
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
    # the fingerprint is per dtype, and known without the weights for a dtype never loaded
    other = load_model("tiny-trained", dtype="float32", weights=False)
    assert other.fingerprint != light.fingerprint


def test_a_cold_cache_reads_the_files_once_then_never(cache, monkeypatch):
    from kvbench.checkpoints import files

    reads = []
    real = files.checkpoint_fingerprint
    monkeypatch.setattr(files, "checkpoint_fingerprint", lambda *a: reads.append(a) or real(*a))
    monkeypatch.setattr(models, "_load_weights", _no_weights)
    first = load_model("tiny-trained-dense", dtype="bfloat16", weights=False)
    second = load_model("tiny-trained-dense", dtype="bfloat16", weights=False)
    assert len(reads) == 1 and first.fingerprint == second.fingerprint


def test_the_fingerprint_is_the_files_digest_computed_independently(cache):
    """Recomputed here from the format's definition (kvbench/checkpoints/files.py) with plain hashlib/json."""
    import hashlib
    import json
    import struct

    from transformers import AutoConfig

    lm = load_model("tiny-trained", dtype="float32", weights=False)
    root = models.materialize_builtin("tiny-trained")
    h = hashlib.sha256(b"kvbench-fingerprint-v2:torch.float32")
    h.update(json.dumps(canonical_config(AutoConfig.from_pretrained(root).to_dict()), sort_keys=True,
                        default=str).encode())  # fmt: skip
    data = (root / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    h.update(b"model.safetensors")
    h.update(json.dumps(sorted([k, v["dtype"], v["shape"]] for k, v in header.items() if k != "__metadata__")).encode())
    h.update(hashlib.sha256(data).hexdigest().encode())
    h.update(json.dumps(sorted(lm.tokenizer.get_vocab().items())).encode())
    h.update(str(lm.tokenizer.chat_template).encode())
    assert lm.fingerprint == h.hexdigest()


def test_a_hub_cache_blob_is_not_read_again(tmp_path):
    from kvbench.checkpoints import files

    blob = tmp_path / "blobs" / ("ab" * 32)
    blob.parent.mkdir()
    blob.write_bytes(b"not what the name says")  # the cache names a blob by its SHA-256: the name is trusted
    link = tmp_path / "snapshots" / "model.safetensors"
    link.parent.mkdir()
    link.symlink_to(blob)
    assert files.file_sha256(link) == "ab" * 32
    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"x" * (files.CHUNK + 5))
    import hashlib

    assert files.file_sha256(plain) == hashlib.sha256(plain.read_bytes()).hexdigest()


def test_a_cut_weights_file_is_refused_by_name(cache, tmp_path):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(models.materialize_builtin("tiny-trained-dense"), ckpt)
    (ckpt / "model.safetensors").write_bytes(b"\x05")
    with pytest.raises(models.ModelError, match="cannot fingerprint its files"):
        load_model(str(ckpt), weights=False)


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
