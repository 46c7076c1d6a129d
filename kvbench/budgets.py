"""Budgets: pure integer arithmetic with exact totals (no torch).

Terms (DESIGN.md, "Budget"):

* ``n``    — context length in tokens (after any middle truncation).
* ``prot`` — protected prefix (chat header + instruction tokens, at most 256), kept by every method on
  top of the budget; eviction only chooses among the ``m = n - prot`` body positions.
* ``k``    — flat per-(layer, head) budget ``round(p * m)`` (round half up, computed exactly in decimal).
* ``B``    — model-wide budget ``L_attn * H_kv * k`` entries.

The allocations (:mod:`kvbench.allocations`) own the choice of counts, with this module's arithmetic
(:func:`per_head_budget`, :func:`total_budget`, :func:`apportion`); the selections that turn scores and counts
into kept positions are :mod:`kvbench.selection`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

from kvbench.errors import KvbenchError

PROTECTED_CAP = 256
ALL_P: tuple[float, ...] = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)


def validate_p(p: float) -> float:
    """Return ``p`` as a float if it is a kept fraction in (0, 1]; raise otherwise."""
    try:
        value = float(p)
    except (TypeError, ValueError):
        raise KvbenchError(f"kept fraction p={p!r} is not a number; use a value in (0, 1], e.g. 0.1") from None
    if not (0.0 < value <= 1.0) or math.isnan(value):
        raise KvbenchError(f"kept fraction p={p} is outside (0, 1]; use e.g. --p 0.5 or --p all")
    return value


def protected_length(prefix_tokens: int, n: int, cap: int = PROTECTED_CAP) -> int:
    """Tokens protected from eviction: the instruction prefix, at most ``cap`` and at most ``n``."""
    return max(0, min(prefix_tokens, cap, n))


def per_head_budget(n: int, prot: int, p: float) -> int:
    """Flat per-(layer, head) budget ``round(p * (n - prot))``, rounding half up exactly.

    ``p`` is read through its shortest decimal repr, so ``0.1 * 4075`` is 407.5 -> 408, not a float
    artefact.
    """
    validate_p(p)
    m = n - prot
    if m < 0:
        raise ValueError(f"protected prefix {prot} exceeds context length {n}")
    return int((Decimal(repr(float(p))) * m).to_integral_value(rounding=ROUND_HALF_UP))


def smallest_p(m: int, decimals: int = 4) -> float:
    """The smallest p of ``decimals`` decimals whose :func:`per_head_budget` keeps one of ``m`` >= 1 body entries:
    ``p * m >= 0.5`` (half up), rounded up to ``decimals`` decimals."""
    p = float((Decimal(1) / (2 * m)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_CEILING))
    return min(p, 1.0)


def total_budget(n: int, prot: int, p: float, n_layers: int, n_kv_heads: int) -> int:
    """Model-wide budget ``B = L_attn * H_kv * round(p * (n - prot))`` in entries."""
    return n_layers * n_kv_heads * per_head_budget(n, prot, p)


def apportion(weights: Sequence[float], total: int, lo: int, hi: int) -> list[int]:
    """Integer counts proportional to ``weights`` with ``lo <= c_i <= hi`` and ``sum(c) == total``.

    Layers whose proportional share falls outside ``[lo, hi]`` are pinned to the bound and the rest is
    re-shared among the others (water filling); the free layers are then integerised by largest
    remainder (ties go to the lower index).
    """
    L = len(weights)
    if L == 0:
        raise ValueError("no layers to allocate")
    if any(w < 0 or math.isnan(w) for w in weights):
        raise ValueError(f"allocation weights must be non-negative, got {list(weights)}")
    if not (L * lo <= total <= L * hi):
        raise ValueError(f"cannot place {total} entries in {L} layers with bounds [{lo}, {hi}]")
    counts: list[int | None] = [None] * L
    while True:
        free = [i for i in range(L) if counts[i] is None]
        remaining = total - sum(c for c in counts if c is not None)
        wsum = sum(weights[i] for i in free)
        share = {i: (remaining * weights[i] / wsum if wsum > 0 else remaining / len(free)) for i in free}
        low = [i for i in free if share[i] < lo]
        high = [i for i in free if share[i] > hi]
        if not low and not high:
            break
        # Pin the side whose violation is largest first; pinning both at once can overshoot.
        if sum(lo - share[i] for i in low) >= sum(share[i] - hi for i in high):
            for i in low:
                counts[i] = lo
        else:
            for i in high:
                counts[i] = hi
    floors = {i: math.floor(share[i]) for i in free}
    left = remaining - sum(floors.values())
    order = sorted(free, key=lambda i: (-(share[i] - floors[i]), i))
    for i in order[:left]:
        floors[i] += 1
    for i in free:
        counts[i] = floors[i]
    result = [int(c) for c in counts]  # type: ignore[arg-type]
    assert sum(result) == total and all(lo <= c <= hi for c in result), (result, total, lo, hi)
    return result
