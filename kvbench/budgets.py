"""Budgets and selection: pure functions with exact integer totals.

Terms (DESIGN.md, "Budget"):

* ``n``    — context length in tokens (after any middle truncation).
* ``prot`` — protected prefix (chat header + instruction tokens, at most 256), kept by every method on
  top of the budget; eviction only chooses among the ``m = n - prot`` body positions.
* ``k``    — flat per-(layer, head) budget ``round(p * m)`` (round half up, computed exactly in decimal).
* ``B``    — model-wide budget ``L_attn * H_kv * k`` entries.

The allocations (:mod:`kvbench.allocations`) own the choice of counts; this module gives them the arithmetic
(:func:`per_head_budget`, :func:`total_budget`, :func:`apportion`) and the two selections: per head
(:func:`select_per_head`, every KV head of layer ``f`` keeps its top ``K_f``) and global (:func:`select_global`,
one top ``B`` over every (layer, head, token), so counts may differ per head).

Kept index sets are returned as ``kept[f][h]``: a sorted 1-D ``LongTensor`` of context positions for
attention-layer ordinal ``f`` and KV head ``h`` (protected positions included).

Ties: entries with equal scores at the budget boundary are decided by one rule in every selection path
(per-head top-``K_l`` for ``flat``/``pyramid``/``gate``, top-``B`` for ``global``): **the later position
wins**; in ``global``, equal scores at the same position go to the later layer, then the later KV head.
It is computed by a stable sort (:func:`top_later_wins`), so it is the same on CPU and GPU and on every
engine (selection runs on the method's scores, not inside an engine).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

import torch

from kvbench.errors import KvbenchError

PROTECTED_CAP = 256
ALL_P: tuple[float, ...] = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)

Kept = list[list[torch.Tensor]]



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



def _with_protected(body_idx: torch.Tensor, prot: int) -> torch.Tensor:
    """Body indices (relative to ``prot``) -> sorted absolute positions with ``0..prot-1`` prepended."""
    absolute = torch.sort(body_idx + prot).values
    return torch.cat([torch.arange(prot, dtype=torch.long, device=absolute.device), absolute])


def top_later_wins(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` largest entries along the last dim of ``scores`` ``[..., N]``, best first;
    equal scores are ordered by index, the larger (later) index first. A stable descending sort of the
    reversed row, so the result is the same on every device."""
    N = scores.shape[-1]
    order = torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True).indices[..., :count]
    return (N - 1) - order


def select_per_head(scores: Sequence[torch.Tensor], counts: Sequence[int], prot: int) -> Kept:
    """Per layer and KV head, keep the protected prefix plus the top ``counts[f]`` body scores.

    scores[f]: ``[H_kv, n]`` (higher = keep); positions ``< prot`` are ignored. Ties: the later position
    wins (module doc).
    """
    kept: Kept = []
    for s, c in zip(scores, counts, strict=True):
        body = s[:, prot:].float()
        if c > body.shape[1]:
            raise ValueError(f"budget {c} exceeds the {body.shape[1]} body entries")
        idx = top_later_wins(body, c)
        kept.append([_with_protected(idx[h], prot) for h in range(body.shape[0])])
    return kept


def select_global(scores: Sequence[torch.Tensor], total: int, prot: int) -> Kept:
    """KVzip-style: one top-``total`` over every (layer, head, body token) score; counts may differ.

    scores[f]: ``[H_kv, n]`` on a common scale across layers. Ties: the later position wins, then the later
    layer, then the later head (module doc).
    """
    stacked = torch.stack([s[:, prot:].float() for s in scores])  # [L, H_kv, m]
    L, H, m = stacked.shape
    if total > stacked.numel():
        raise ValueError(f"budget {total} exceeds the {stacked.numel()} body entries")
    # position-major order (position, layer, head), so that a later flat index is a later position
    by_position = stacked.permute(2, 0, 1).reshape(-1)
    chosen = torch.zeros(by_position.numel(), dtype=torch.bool, device=by_position.device)
    chosen[top_later_wins(by_position, total)] = True
    mask = chosen.view(m, L, H).permute(1, 2, 0)  # [L, H_kv, m]
    return [[_with_protected(mask[f, h].nonzero().squeeze(1), prot) for h in range(H)] for f in range(L)]


def keep_all(n: int, n_layers: int, n_kv_heads: int) -> Kept:
    """Every position for every layer and head (the ``full`` method's child)."""
    return [[torch.arange(n, dtype=torch.long) for _ in range(n_kv_heads)] for _ in range(n_layers)]
