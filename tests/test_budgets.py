"""Budgets and allocations against hand-worked examples and brute-force definitions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench import budgets
from kvbench.errors import KvbenchError


def test_per_head_budget_rounds_half_up_exactly():
    assert budgets.per_head_budget(4075 + 10, 10, 0.1) == 408  # 407.5 -> 408 (banker's rounding says 408 too)
    assert budgets.per_head_budget(4085 + 10, 10, 0.1) == 409  # 408.5 -> 409 (banker's would give 408)
    assert budgets.per_head_budget(100, 0, 0.3) == 30  # 0.3 * 100 is 30.000000000000004 in floats
    assert budgets.per_head_budget(7, 2, 1.0) == 5
    assert budgets.total_budget(110, 10, 0.25, 3, 2) == 3 * 2 * 25


@pytest.mark.parametrize("p", [0, -0.1, 1.01, float("nan"), "x"])
def test_p_outside_range_is_rejected(p):
    with pytest.raises(KvbenchError, match=r"\(0, 1\]|not a number"):
        budgets.validate_p(p)


def test_protected_length_is_capped():
    assert budgets.protected_length(300, 5000) == 256
    assert budgets.protected_length(40, 5000) == 40
    assert budgets.protected_length(40, 30) == 30


def test_pyramid_hand_worked():
    # k = 100, L = 4, beta = 20: k_min = 5, k_max = 195, step 63.33: 195, 131.67, 68.33, 5 (sum 400).
    # Floors 195, 131, 68, 5 = 399; the one left goes to the largest remainder (.67, layer 1).
    assert budgets.pyramid(100, 4, capacity=1000) == [195, 132, 68, 5]
    # k = 40: k_min = 2 < 4 -> last layer lifted to 4, the deficit taken from the others in proportion.
    got = budgets.pyramid(40, 4, capacity=1000)
    assert got[-1] == 4 and sum(got) == 160 and got == sorted(got, reverse=True)
    # capacity binds: 2k - k/20 = 195 > 120 for the first layer
    got = budgets.pyramid(100, 4, capacity=120)
    assert got[0] == 120 and sum(got) == 400 and max(got) <= 120
    assert budgets.pyramid(7, 1, capacity=10) == [7]


def test_gate_largest_remainder_hand_worked():
    # w = 0.5, 0.3, 0.2 of 3*10 = 30: shares 15, 9, 6 -> exact.
    assert budgets.gate(10, [0.5, 0.3, 0.2], capacity=100) == [15, 9, 6]
    # w = 1, 1, 1 of 3*7 = 21 -> 7 each; w = 2, 1, 1 of 3*5 = 15: 7.5, 3.75, 3.75 -> floors 7, 3, 3 (13),
    # two left: largest remainders .75 (layer 1), .75 (layer 2) -> 7, 4, 4.
    assert budgets.gate(7, [1, 1, 1], capacity=100) == [7, 7, 7]
    assert budgets.gate(5, [2, 1, 1], capacity=100) == [7, 4, 4]
    # w = 4, 1, 1 of 15: shares 10, 2.5, 2.5; capacity 8 pins layer 0 at 8, the other 7 are shared
    # 3.5 / 3.5 -> floors 3, 3 and the tie goes to the lower index.
    assert budgets.gate(5, [4, 1, 1], capacity=8) == [8, 4, 3]


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=12),
    per_layer=st.integers(0, 50),
    capacity=st.integers(1, 60),
    lo=st.integers(0, 4),
)
def test_apportion_invariants(weights, per_layer, capacity, lo):
    L = len(weights)
    total = min(per_layer, capacity) * L
    lo = min(lo, total // L)
    counts = budgets.apportion(weights, total, lo=lo, hi=capacity)
    assert sum(counts) == total
    assert all(lo <= c <= capacity for c in counts)
    # no unbound layer is more than one entry away from its proportional share when bounds don't bind
    if sum(weights) > 0 and lo == 0 and all(total * w / sum(weights) <= capacity for w in weights):
        assert all(abs(c - total * w / sum(weights)) < 1 for c, w in zip(counts, weights, strict=False))


@settings(max_examples=100, deadline=None)
@given(k=st.integers(0, 400), L=st.integers(1, 16), extra=st.integers(0, 400))
def test_pyramid_invariants(k, L, extra):
    capacity = k + extra
    counts = budgets.pyramid(k, L, capacity=capacity)
    assert sum(counts) == k * L
    assert all(min(4, k) <= c <= capacity for c in counts)
    assert counts == sorted(counts, reverse=True) or len(set(counts)) == 1 or capacity < 2 * k


def test_select_per_head_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    prot, n, H = 5, 40, 3
    scores = [torch.rand(H, n, generator=g) for _ in range(2)]
    kept = budgets.select_per_head(scores, [7, 12], prot)
    for f, c in enumerate([7, 12]):
        for h in range(H):
            body = sorted(range(prot, n), key=lambda i: -float(scores[f][h, i]))[:c]
            assert kept[f][h].tolist() == list(range(prot)) + sorted(body)


def test_select_global_matches_brute_force():
    g = torch.Generator().manual_seed(1)
    prot, n, H, L = 3, 20, 2, 3
    scores = [torch.rand(H, n, generator=g) for _ in range(L)]
    B = 25
    kept = budgets.select_global(scores, B, prot)
    triples = sorted(
        ((float(scores[f][h, i]), f, h, i) for f in range(L) for h in range(H) for i in range(prot, n)),
        reverse=True,
    )
    chosen = {(f, h, i) for _, f, h, i in triples[:B]}
    for f in range(L):
        for h in range(H):
            body = sorted(i for (ff, hh, i) in chosen if ff == f and hh == h)
            assert kept[f][h].tolist() == list(range(prot)) + body
    assert sum(len(k) - prot for heads in kept for k in heads) == B


def test_layer_counts_dispatch_and_errors():
    assert budgets.layer_counts("flat", 9, 3, 100) == [9, 9, 9]
    with pytest.raises(KvbenchError, match="gate mean"):
        budgets.layer_counts("gate", 9, 3, 100)
    with pytest.raises(KvbenchError, match="valid allocations"):
        budgets.layer_counts("nope", 9, 3, 100)
