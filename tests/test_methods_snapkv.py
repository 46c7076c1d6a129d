"""SnapKV against an independent brute-force computation (explicit softmax and pooling loops)."""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.methods import get_method
from kvbench.methods.snapkv import SnapKV
from tests.conftest import tiny_model
from tests.fakes import FakeParent


def fake_parent(n: int, H: int = 4, H_kv: int = 2, D: int = 8, layers: int = 2, seed: int = 0) -> FakeParent:
    g = torch.Generator().manual_seed(seed)
    keys = [torch.randn(H_kv, n, D, generator=g) * 1.5 for _ in range(layers)]
    queries = [torch.randn(H, n, D, generator=g) * 1.5 for _ in range(layers)]
    return FakeParent(keys, queries)


def brute_force(parent: FakeParent, window: int = 32, kernel: int = 7, keep_window: bool = False) -> list[torch.Tensor]:
    """Explicit loops: per query head, per window query, a softmax over the keys it may see."""
    n, H, H_kv, D = parent.n, parent.n_heads, parent.n_kv_heads, parent.head_dim
    G = H // H_kv
    W = min(window, n)
    start = n - W
    out = []
    for f in range(parent.n_attn_layers):
        K = parent.keys(f).double()
        Q = parent.query_list[f].double()
        per_q_head = []
        for h in range(H):
            received = [0.0] * n
            for t in range(start, n):
                logits = [float(Q[h, t] @ K[h // G, j]) / math.sqrt(D) for j in range(t + 1)]
                top = max(logits)
                exps = [math.exp(x - top) for x in logits]
                total = sum(exps)
                for j in range(t + 1):
                    received[j] += exps[j] / total
            scored = received[:start] if keep_window else received
            half = kernel // 2
            pooled = [max(scored[max(0, j - half) : j + half + 1]) for j in range(len(scored))]
            per_q_head.append(pooled)
        rows = []
        for g in range(H_kv):
            row = [sum(per_q_head[g * G + i][j] for i in range(G)) / G for j in range(len(per_q_head[0]))]
            rows.append(row)
        out.append(torch.tensor(rows, dtype=torch.float64))
    return out


@pytest.mark.parametrize("n", [45, 20])  # longer than the window, and shorter (the window is everything)
def test_snapkv_matches_brute_force(n):
    parent = fake_parent(n)
    got = SnapKV().score(parent)
    want = brute_force(parent)
    assert len(got) == parent.n_attn_layers
    for g, w in zip(got, want, strict=True):
        assert g.shape == (parent.n_kv_heads, n)
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-6)


def test_snapkv_keep_window_variant():
    parent = fake_parent(45, seed=3)
    method = SnapKV()
    method.keep_window = True
    got = method.score(parent)
    want = brute_force(parent, keep_window=True)
    start = 45 - 32
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g[:, :start].double(), w, rtol=1e-5, atol=1e-6)
        assert bool((g[:, start:].min(dim=1).values > g[:, :start].max(dim=1).values).all())


def test_snapkv_keep_window_when_the_window_is_the_whole_context():
    # n <= window: nothing is scored outside the window, so every position is a window key with the same score
    parent = fake_parent(20, seed=4)
    method = SnapKV()
    method.keep_window = True
    for g in method.score(parent):
        assert g.shape == (parent.n_kv_heads, 20)
        assert bool((g == g[:, :1]).all())


def test_snapkv_keep_window_with_one_key_before_the_window():
    # n = window + 1: one key outside the window; the window keys still rank above it
    parent = fake_parent(33, seed=5)
    method = SnapKV()
    method.keep_window = True
    want = brute_force(parent, keep_window=True)
    for g, w in zip(method.score(parent), want, strict=True):
        torch.testing.assert_close(g[:, :1].double(), w, rtol=1e-5, atol=1e-6)
        assert bool((g[:, 1:].min(dim=1).values > g[:, 0]).all())


def test_snapkv_attended_key_wins_and_pools_to_neighbours():
    """A key aligned with every window query takes (and spreads by pooling) the top score."""
    n, D = 60, 8
    parent = fake_parent(n, H=2, H_kv=1, D=D, layers=1, seed=1)
    direction = torch.ones(D) / math.sqrt(D)
    parent.query_list[0][:, :, :] = 0.1 * parent.query_list[0] + 4 * direction
    parent.key_list[0][0, 10] = 6 * direction
    scores = SnapKV().score(parent)[0][0]
    assert int(scores.argmax()) in range(7, 14)
    assert torch.allclose(scores[7:14], scores[10].expand(7))
    assert bool((scores[7:14] > scores[20:28].max()).all())


def test_snapkv_registered_with_settings():
    method = get_method("snapkv")
    assert isinstance(method, SnapKV)
    assert (method.query_window, method.kernel_size, method.default_allocation) == (32, 7, "flat")


def test_snapkv_on_tiny_model():
    from kvbench.engines.torch_engine import TorchEngine

    engine = TorchEngine(tiny_model("qwen3_next"))
    ids = torch.randint(0, 256, (80,), generator=torch.Generator().manual_seed(0)).tolist()
    parent = engine.prefill(ids, prot=4, query_window=SnapKV.query_window)
    try:
        method = get_method("snapkv")
        scores = method.score(parent)
        assert len(scores) == parent.n_attn_layers
        for s in scores:
            assert s.shape == (parent.n_kv_heads, parent.n)
            assert bool(torch.isfinite(s).all())
            # summed attention of 32 window queries (each row sums to 1), pooled and group-averaged
            assert float(s.min()) >= 0 and float(s.max()) <= 32 + 1e-4
        kept = method.select(parent, scores, 0.5, "flat")
        assert all(len(idx) == 4 + 38 for layer in kept for idx in layer)
    finally:
        parent.release()
