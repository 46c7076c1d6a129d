"""Budgets and allocations against hand-worked examples and brute-force definitions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench import allocations, budgets, selection
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
    assert allocations.pyramid(100, 4, capacity=1000) == [195, 132, 68, 5]
    # k = 40: k_min = 2 < 4 -> last layer lifted to 4, the deficit taken from the others in proportion.
    got = allocations.pyramid(40, 4, capacity=1000)
    assert got[-1] == 4 and sum(got) == 160 and got == sorted(got, reverse=True)
    # capacity binds: 2k - k/20 = 195 > 120, so PyramidKV's rule: k_max = 120, k_min = 2k - 120 = 80, linear:
    # 120, 106.67, 93.33, 80 -> floors sum to 399, the one left to the largest remainder (.67, layer 1).
    assert allocations.pyramid(100, 4, capacity=120) == [120, 107, 93, 80]
    assert allocations.pyramid(7, 1, capacity=10) == [7]


def _pyramid_exact(k: int, n_layers: int) -> list[int] | None:
    """PyramidKV's counts computed apart from kvbench, in exact fractions, where no bound binds (``k / 20 >= 4``
    and ``2k - k / 20 <= capacity``): ``k_min = k / 20`` (a true quotient), ``k_max = 2k - k_min``, linear over
    the layers, then the floors plus one for each of the largest remainders (ties to the lower layer)."""
    from fractions import Fraction

    k_min = Fraction(k, 20)
    k_max = 2 * k - k_min
    raw = [k_max - f * (k_max - k_min) / (n_layers - 1) for f in range(n_layers)]
    counts = [int(r) for r in raw]  # floors: every raw count is positive
    left = n_layers * k - sum(counts)
    order = sorted(range(n_layers), key=lambda f: (-(raw[f] - counts[f]), f))
    if 0 < left < n_layers and raw[order[left - 1]] - counts[order[left - 1]] == raw[order[left]] - counts[order[left]]:
        return None  # an exact tie at the cut: kvbench's float shares decide it, so no exact answer to hold it to
    for f in order[:left]:
        counts[f] += 1
    return counts


def test_pyramid_equals_an_exact_computation():
    """k_min is k / beta, not k // beta: on every (k, L) with k from 80 to 400 and 2 to 12 layers the counts are
    the exact fractions' (a floored k_min moves some layer in most of them), and the issue's hand-worked case,
    where the floor of 4 binds: k = 57 over 3 layers is 111.15, 57, 2.85 -> the last lifted to 4 and the 167
    left shared 110.39 / 56.61 -> 110, 57, 4 (a floored k_min gives 111, 56, 4)."""
    checked = 0
    for n_layers in range(2, 13):
        for k in range(80, 401):
            want = _pyramid_exact(k, n_layers)
            if want is not None:
                assert allocations.pyramid(k, n_layers, capacity=10_000) == want, (k, n_layers)
                checked += 1
    assert checked > 3000  # of 3,531 pairs; the rest tie exactly at the cut
    assert allocations.pyramid(57, 3, capacity=4075) == [110, 57, 4]


def test_pyramid_above_the_cap_follows_pyramidkv():
    # issue 18: 3 attention layers, body 1,000, p = 0.7 -> k = 700, 2k - k/20 = 1365 > 1000:
    # max_num = body = 1000, min_num = 2k - body = 400, linear in between (the old water filling gave 1000, 1000, 100).
    k = budgets.per_head_budget(1000, 0, 0.7)
    assert allocations.pyramid(k, 3, capacity=1000) == [1000, 700, 400]
    # 16 layers, body 4,075, p = 0.9: k = 3,667.5 -> 3,668; max 4,075, min 2 * 3,668 - 4,075 = 3,261 (was 539).
    k = budgets.per_head_budget(4075 + 12, 12, 0.9)
    assert k == 3668
    got = allocations.pyramid(k, 16, capacity=4075)
    assert got[0] == 4075 and got[-1] == 3261 and sum(got) == 16 * 3668
    step = (4075 - 3261) / 15
    assert all(abs(c - (4075 - f * step)) < 1 for f, c in enumerate(got))
    # k == body (p = 1): every layer keeps the whole body
    assert allocations.pyramid(50, 5, capacity=50) == [50] * 5


def test_gate_largest_remainder_hand_worked():
    # w = 0.5, 0.3, 0.2 of 3*10 = 30: shares 15, 9, 6 -> exact.
    assert allocations.gate(10, [0.5, 0.3, 0.2], capacity=100) == [15, 9, 6]
    # w = 1, 1, 1 of 3*7 = 21 -> 7 each; w = 2, 1, 1 of 3*5 = 15: 7.5, 3.75, 3.75 -> floors 7, 3, 3 (13),
    # two left: largest remainders .75 (layer 1), .75 (layer 2) -> 7, 4, 4.
    assert allocations.gate(7, [1, 1, 1], capacity=100) == [7, 7, 7]
    assert allocations.gate(5, [2, 1, 1], capacity=100) == [7, 4, 4]
    # w = 4, 1, 1 of 15: shares 10, 2.5, 2.5; capacity 8 pins layer 0 at 8, the other 7 are shared
    # 3.5 / 3.5 -> floors 3, 3 and the tie goes to the lower index.
    assert allocations.gate(5, [4, 1, 1], capacity=8) == [8, 4, 3]


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
    counts = allocations.pyramid(k, L, capacity=capacity)
    assert sum(counts) == k * L
    assert all(min(4, k) <= c <= capacity for c in counts)
    assert counts == sorted(counts, reverse=True)
    # above the cap: PyramidKV's max_num = body, min_num = 2k - body (unless kvbench's floor of min(4, k) binds)
    if L > 1 and 2 * k - k / 20 > capacity and 2 * k - capacity >= min(4, k):
        assert counts[0] == capacity and abs(counts[-1] - (2 * k - capacity)) < 1


def test_select_per_head_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    prot, n, H = 5, 40, 3
    scores = [torch.rand(H, n, generator=g) for _ in range(2)]
    kept = selection.select_per_head(scores, [7, 12], prot)
    for f, c in enumerate([7, 12]):
        for h in range(H):
            body = sorted(range(prot, n), key=lambda i: -float(scores[f][h, i]))[:c]
            assert kept[f][h].tolist() == list(range(prot)) + sorted(body)


def test_select_global_matches_brute_force():
    g = torch.Generator().manual_seed(1)
    prot, n, H, L = 3, 20, 2, 3
    scores = [torch.rand(H, n, generator=g) for _ in range(L)]
    B = 25
    kept = selection.select_global(scores, B, prot)
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


def _brute_force_later_wins(row: list[float], count: int) -> list[int]:
    """The ``count`` best positions of ``row`` by (score, position), both descending."""
    return sorted(sorted(range(len(row)), key=lambda i: (row[i], i), reverse=True)[:count])


def test_select_per_head_ties_go_to_the_later_position():
    prot = 2
    # body scores (positions 2..11): a block of five equal scores across the boundary of every count
    row = [9.0, 9.0, 1.0, 5.0, 5.0, 5.0, 5.0, 5.0, 7.0, 0.0, 2.0, 5.0]
    scores = [torch.tensor([row, row[::-1]])]
    for c in range(0, 11):
        kept = selection.select_per_head(scores, [c], prot)
        for h, r in enumerate((row, row[::-1])):
            body = [prot + i for i in _brute_force_later_wins(r[prot:], c)]
            assert kept[0][h].tolist() == list(range(prot)) + body, (c, h)
    # hand-worked: count 3 keeps 7 (position 8), then the two latest 5s (positions 11 and 7)
    assert selection.select_per_head(scores, [3], prot)[0][0].tolist() == [0, 1, 7, 8, 11]


def test_select_per_head_all_equal_keeps_the_last_positions():
    scores = [torch.zeros(2, 20), torch.ones(2, 20)]
    kept = selection.select_per_head(scores, [3, 5], prot=4)
    assert kept[0][1].tolist() == [0, 1, 2, 3, 17, 18, 19]
    assert kept[1][0].tolist() == [0, 1, 2, 3, 15, 16, 17, 18, 19]


def test_select_global_ties_go_to_later_position_then_layer_then_head():
    prot, L, H, n = 1, 3, 2, 9
    g = torch.Generator().manual_seed(3)
    scores = [torch.randint(0, 3, (H, n), generator=g).float() for _ in range(L)]  # heavy ties
    for total in range(0, L * H * (n - prot) + 1):
        kept = selection.select_global(scores, total, prot)
        entries = sorted(
            ((float(scores[f][h, i]), i, f, h) for f in range(L) for h in range(H) for i in range(prot, n)),
            reverse=True,
        )[:total]
        for f in range(L):
            for h in range(H):
                body = sorted(i for _, i, ff, hh in entries if (ff, hh) == (f, h))
                assert kept[f][h].tolist() == list(range(prot)) + body, (total, f, h)
    # hand-worked: all equal, budget 3 -> the last position of layer 2 head 1, layer 2 head 0, layer 1 head 1
    flat = [torch.zeros(H, n) for _ in range(L)]
    kept = selection.select_global(flat, 3, prot)
    assert [len(k) - prot for heads in kept for k in heads] == [0, 0, 0, 1, 1, 1]
    assert kept[2][0].tolist() == [0, n - 1] and kept[1][1].tolist() == [0, n - 1]


def test_ties_are_identical_on_cpu_and_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no GPU on this machine: the CPU/GPU comparison runs where one is present")
    scores = [torch.randint(0, 4, (2, 300)).float() for _ in range(3)]
    cpu = selection.select_per_head(scores, [50, 80, 120], 10), selection.select_global(scores, 400, 10)
    gpu_scores = [s.cuda() for s in scores]
    gpu = selection.select_per_head(gpu_scores, [50, 80, 120], 10), selection.select_global(gpu_scores, 400, 10)
    for a, b in zip(cpu, gpu, strict=True):
        assert [[k.tolist() for k in heads] for heads in a] == [[k.cpu().tolist() for k in heads] for heads in b]


def test_layer_counts_dispatch_and_errors():
    assert allocations.layer_counts("flat", 9, 3, 100) == [9, 9, 9]
    with pytest.raises(KvbenchError, match="gate mean"):
        allocations.layer_counts("gate", 9, 3, 100)
    with pytest.raises(KvbenchError, match="valid allocations"):
        allocations.layer_counts("nope", 9, 3, 100)


# --- edges and messages (survivors of the mutation run, docs/testing.md) --------------------------------------


def test_zero_protected_prefix_and_zero_body():
    assert budgets.protected_length(0, 5000) == 0  # no instruction: nothing protected
    assert budgets.protected_length(40, 0) == 0
    assert budgets.per_head_budget(10, 10, 0.5) == 0  # the whole context protected: an empty body, not an error
    with pytest.raises(ValueError, match="^protected prefix 11 exceeds context length 10$"):
        budgets.per_head_budget(10, 11, 0.5)


def test_smallest_p_keeps_one_body_entry():
    """The runner's hint for a p that keeps nothing: the smallest 4-decimal p with ``round(p * m) >= 1``."""
    assert budgets.smallest_p(4075) == 0.0002  # 1 / 8150 = 0.000123 -> up to 0.0002
    assert budgets.smallest_p(5000) == 0.0001  # exactly 1 / 10000
    assert budgets.smallest_p(1) == 0.5 and budgets.smallest_p(3, decimals=2) == 0.17
    for m in (1, 2, 3, 7, 999, 4075, 123_457):
        p = budgets.smallest_p(m)
        assert budgets.per_head_budget(m, 0, p) >= 1  # keeps one (at least: 0.0001 is the floor)
        assert p == 0.0001 or budgets.per_head_budget(m, 0, round(p - 0.0001, 4)) == 0


def test_keep_all_and_global_counts():
    kept = selection.keep_all(5, 2, 3)
    assert len(kept) == 2 and all(len(heads) == 3 for heads in kept)
    assert all(k.dtype == torch.long and k.tolist() == [0, 1, 2, 3, 4] for heads in kept for k in heads)
    with pytest.raises(ValueError, match="^the global allocation has no per-layer counts; use select_global$"):
        allocations.global_counts(5, 2, 10)
    with pytest.raises(ValueError, match="no per-layer counts"):
        allocations.layer_counts("global", 5, 2, 10)


def test_gate_lets_a_closed_layer_keep_nothing():
    assert allocations.gate(6, [0.0, 1.0, 2.0], capacity=100) == [0, 6, 12]
    assert allocations.layer_counts("gate", 6, 3, 100, [0.0, 1.0, 2.0]) == [0, 6, 12]  # a count of 0 is valid
    with pytest.raises(KvbenchError) as err:
        allocations.gate_counts(6, 3, 100, [1.0, 2.0])
    assert str(err.value) == "the gate allocation needs one gate mean per attention layer"


def test_apportion_rejects_bad_weights_by_name():
    with pytest.raises(ValueError, match="^no layers to allocate$"):
        budgets.apportion([], 0, 0, 1)
    for bad in ([1.0, float("nan")], [1.0, -0.5]):
        with pytest.raises(ValueError, match="^allocation weights must be non-negative"):
            budgets.apportion(bad, 4, 0, 4)


def test_layer_counts_refuses_a_plugin_allocation_that_breaks_the_budget(monkeypatch):
    """An allocation's counts are checked: n_layers of them, each in [0, capacity], summing to n_layers * k."""

    class OneAllocation:
        def __init__(self, counts):
            self.counts = counts

        def get(self, name):
            return lambda k, n_layers, capacity, gate_means: list(self.counts)

        def source(self, name):
            return f"entry point mypkg:{name}"

    for counts in ([18], [9, 8], [10, 9, -1], [9, 9, 0, 0], [20, -2, 0]):  # 3 layers, k = 6, capacity 10
        monkeypatch.setattr(allocations, "ALLOCATIONS", OneAllocation(counts))
        with pytest.raises(KvbenchError) as err:
            allocations.layer_counts("bad", 6, 3, 10)
        assert str(err.value) == (
            f"allocation 'bad' (entry point mypkg:bad) gave per-layer counts {counts} for k=6, 3 layers, "
            "capacity 10: expected 3 counts in [0, 10] summing to 18"
        )
    monkeypatch.setattr(allocations, "ALLOCATIONS", OneAllocation([0, 10, 8]))
    assert allocations.layer_counts("bad", 6, 3, 10) == [0, 10, 8]


def test_selection_refuses_mismatched_inputs_by_name():
    scores = [torch.rand(2, 25), torch.rand(2, 25)]
    with pytest.raises(ValueError):  # one count per layer, no fewer
        selection.select_per_head(scores, [3], prot=5)
    with pytest.raises(ValueError):
        selection.select_per_head(scores, [3, 3, 3], prot=5)
    with pytest.raises(ValueError, match="^budget 21 exceeds the 20 body entries$"):
        selection.select_per_head(scores, [3, 21], prot=5)
    with pytest.raises(ValueError, match="^budget 81 exceeds the 80 body entries$"):
        selection.select_global(scores, 81, prot=5)


def test_apportion_water_filling_hand_worked():
    # all-zero weights share equally
    assert budgets.apportion([0.0, 0.0, 0.0], 6, 0, 10) == [2, 2, 2]
    # both bounds violated: shares 20 * w / 45.5 = 8.79, 0, 2.20, 0.22, 8.79 with [lo, hi] = [3, 5]; the high side
    # overshoots more (7.58 against 6.58), so layers 0 and 4 are pinned at 5 first; the 10 left give shares 0, 9.09,
    # 0.91: now the low side (5.09 against 4.09) pins layers 1 and 3 at 3; layer 2 takes the 4 left
    assert budgets.apportion([20, 0, 5, 0.5, 20], 20, 3, 5) == [5, 3, 4, 3, 5]
    with pytest.raises(ValueError, match=r"^cannot place 11 entries in 2 layers with bounds \[0, 5\]$"):
        budgets.apportion([1, 1], 11, 0, 5)
    with pytest.raises(ValueError, match=r"^allocation weights must be non-negative, got \[1.0, -0.5\]$"):
        budgets.apportion([1.0, -0.5], 4, 0, 4)
