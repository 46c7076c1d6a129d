"""``keydiff``: KeyDiff (Park et al., 2025, arXiv 2504.15364), key-similarity eviction."""

from __future__ import annotations

import torch

from kvbench.engines.base import ParentSession
from kvbench.methods import EvictionMethod, register_method

EPS = 1e-8


def keydiff_scores(keys: torch.Tensor) -> torch.Tensor:
    """``-cos(k_i, mean_j k_j)`` per KV head: keys ``[H_kv, n, D]`` -> scores ``[H_kv, n]`` (float32).

    The anchor is the plain (unnormalised) mean of the head's ``n`` keys; norms are clamped at ``EPS``
    so a zero key or a zero anchor scores 0 instead of NaN.
    """
    k = keys.float()
    anchor = k.mean(dim=1, keepdim=True)  # [H_kv, 1, D]
    dots = (k * anchor).sum(dim=-1)
    norms = k.norm(dim=-1).clamp_min(EPS) * anchor.norm(dim=-1).clamp_min(EPS)
    return -(dots / norms)


@register_method
class KeyDiff(EvictionMethod):
    """Keeps the keys least similar to their head's mean key.

    Per attention layer and KV head: ``score_i = -cos(k_i, k̄)``, ``k̄ = (1/n) Σ_j k_j`` over all ``n``
    context positions (protected prefix included), keys as stored in the cache (post k_norm and RoPE),
    in float32. Higher = keep, so the least similar keys are kept; flat per-head budgets.

    Differences from the reference implementations:

    * kvpress ``KeyDiffPress`` anchors on the mean of the *unit-normalised* keys
      (``normalize(K).mean()``); here the anchor is the unnormalised mean key (the GateSight paper's
      Appendix G setting). The two agree up to how strongly large-norm keys pull the anchor.
    * the KeyDiff paper evicts block-wise while streaming the prompt (kvpress ``BlockPress``, block 128,
      anchor recomputed over kept ∪ block); here one scoring pass over the complete prefix, as for the
      other baselines.
    """

    name = "keydiff"
    default_allocation = "flat"

    def score(self, parent: ParentSession) -> list[torch.Tensor]:
        return [keydiff_scores(parent.keys(f)) for f in range(parent.n_attn_layers)]
