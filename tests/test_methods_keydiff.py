"""KeyDiff against an explicit per-position cosine to the unnormalised mean key."""

from __future__ import annotations

import math

import torch

from kvbench.methods import get_method
from kvbench.methods.keydiff import KeyDiff
from tests.conftest import tiny_model
from tests.fakes import FakeParent


def brute_force(keys: torch.Tensor) -> torch.Tensor:
    H_kv, n, D = keys.shape
    out = torch.zeros(H_kv, n, dtype=torch.float64)
    for h in range(H_kv):
        rows = keys[h].double().tolist()
        mean = [sum(rows[i][d] for i in range(n)) / n for d in range(D)]
        mean_norm = math.sqrt(sum(x * x for x in mean))
        for i in range(n):
            dot = sum(rows[i][d] * mean[d] for d in range(D))
            norm = math.sqrt(sum(x * x for x in rows[i]))
            out[h, i] = -dot / (norm * mean_norm)
    return out


def test_keydiff_matches_explicit_cosine():
    g = torch.Generator().manual_seed(0)
    # an offset so the mean key is far from zero, and varied norms so a unit-key anchor would differ
    keys = [torch.randn(2, 30, 6, generator=g) * torch.rand(2, 30, 1, generator=g) * 5 + 0.7 for _ in range(3)]
    got = KeyDiff().score(FakeParent(keys))
    assert len(got) == 3
    for s, k in zip(got, keys, strict=True):
        assert s.shape == (2, 30)
        torch.testing.assert_close(s.double(), brute_force(k), rtol=1e-5, atol=1e-6)


def test_keydiff_anchor_is_the_unnormalised_mean():
    """Two long keys along x and many short ones along y: the plain mean points along x, the mean of unit
    keys along y, so the two anchors rank the directions oppositely."""
    keys = torch.zeros(1, 12, 2)
    keys[0, :2, 0] = 100.0
    keys[0, 2:, 1] = 0.1
    s = KeyDiff().score(FakeParent([keys]))[0][0]
    assert bool((s[2:] > s[:2].max()).all())  # the y keys are the least similar to the plain mean


def test_keydiff_keeps_the_outlier_and_survives_zero_keys():
    keys = torch.ones(1, 10, 4)
    keys[0, 4] = -1.0  # opposite to the mean
    keys[0, 7] = 0.0  # zero key: cosine defined as 0
    s = KeyDiff().score(FakeParent([keys]))[0][0]
    assert int(s.argmax()) == 4
    assert bool(torch.isfinite(s).all()) and float(s[7]) == 0.0


def test_keydiff_on_tiny_model():
    from kvbench.engines.torch_engine import TorchEngine

    engine = TorchEngine(tiny_model("qwen3_next"))
    ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    parent = engine.prefill(ids, prot=4, query_window=0)
    try:
        method = get_method("keydiff")
        scores = method.score(parent)
        assert len(scores) == parent.n_attn_layers
        for f, s in enumerate(scores):
            assert s.shape == (parent.n_kv_heads, parent.n)
            assert bool(torch.isfinite(s).all()) and float(s.abs().max()) <= 1 + 1e-5
            torch.testing.assert_close(s.double(), brute_force(parent.keys(f)), rtol=1e-4, atol=1e-5)
        kept = method.select(parent, scores, 0.25, "flat")
        assert all(len(idx) == 4 + 15 for layer in kept for idx in layer)
    finally:
        parent.release()
