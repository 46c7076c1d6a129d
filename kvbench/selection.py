"""Selection: a method's scores and per-layer counts (or one model-wide total) -> the kept positions.

Kept index sets are returned as ``kept[f][h]``: a sorted 1-D ``LongTensor`` of context positions for
attention-layer ordinal ``f`` and KV head ``h`` (protected positions included). Per head
(:func:`select_per_head`): every KV head of layer ``f`` keeps its top ``K_f``; global (:func:`select_global`):
one top ``B`` over every (layer, head, token), so counts may differ per head.

Ties: entries with equal scores at the budget boundary are decided by one rule in every selection path
(per-head top-``K_l`` for ``flat``/``pyramid``/``gate``, top-``B`` for ``global``): **the later position
wins**; in ``global``, equal scores at the same position go to the later layer, then the later KV head.
It is computed by a stable sort (:func:`top_later_wins`), so it is the same on CPU and GPU and on every
engine (selection runs on the method's scores, not inside an engine).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Kept = list[list[torch.Tensor]]


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
