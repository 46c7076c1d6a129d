"""GateSight input features (paper §4.1, Eq. 3).

For attention layer ordinal ``f`` (global index ``attn_layer_ids[f]``) the *window* ``W(f)`` is the up to
``window`` GDN layers whose global index is below ``attn_layer_ids[f]`` (the nearest ones, in increasing
order; fewer for the first attention layer). The input of context entry ``p`` (0-based position,
``i = p + 1`` in the paper's 1-based notation) is::

    x_p = [ beta[j][p, m], g[j][p, m], |v|[j][p, m]   for j in W(f), m = 0..Hv-1 ]   (layer, head, signal)
          + [ i/n, (n - i)/n, log(1 + n - i)/log(1 + n) ]                             (age)

so ``len(W(f)) * Hv * 3 + 3`` inputs (867 for Qwen3.5-27B: 6 layers x 48 heads x 3 + 3). Layers are
addressed by GDN *ordinal* (index into ``gdn_layer_ids``). The estimator standardises these raw features
with stored training statistics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

N_SIGNALS = 3  # beta, g, |v|
N_AGE = 3
SIGNAL_NAMES = ("beta", "g", "vnorm")
AGE_NAMES = ("i/n", "(n-i)/n", "log(1+n-i)/log(1+n)")

__all__ = [
    "AGE_NAMES",
    "N_AGE",
    "N_SIGNALS",
    "SIGNAL_NAMES",
    "age_features",
    "feature_dims",
    "feature_names",
    "layer_features",
    "window_ordinals",
]


def window_ordinals(attn_layer_ids: Sequence[int], gdn_layer_ids: Sequence[int], window: int) -> list[list[int]]:
    """Per attention layer ordinal: the GDN ordinals of its window (nearest ``window`` preceding GDN layers,
    ascending)."""
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    out = []
    for layer in attn_layer_ids:
        before = [o for o, g in enumerate(gdn_layer_ids) if g < layer]
        out.append(before[max(0, len(before) - window) :] if window else [])
    return out


def feature_dims(windows: Sequence[Sequence[int]], n_value_heads: int) -> list[int]:
    """Input width per attention layer: ``len(W(f)) * Hv * 3 + 3``."""
    return [len(w) * n_value_heads * N_SIGNALS + N_AGE for w in windows]


def feature_names(window: Sequence[int], gdn_layer_ids: Sequence[int], n_value_heads: int) -> list[str]:
    """Human-readable names of one layer's inputs, in feature order."""
    names = [f"gdn{gdn_layer_ids[o]}.h{m}.{s}" for o in window for m in range(n_value_heads) for s in SIGNAL_NAMES]
    return names + [f"age:{a}" for a in AGE_NAMES]


def age_features(n: int, positions: torch.Tensor | None = None, *, device=None) -> torch.Tensor:
    """``[P, 3]`` float32 age features of 0-based ``positions`` (default all ``0..n-1``) in a context of ``n``."""
    if positions is None:
        positions = torch.arange(n, device=device)
    i = positions.to(torch.float64) + 1.0
    return torch.stack([i / n, (n - i) / n, torch.log1p(n - i) / math.log1p(n)], dim=-1).float()


def layer_features(
    beta: Sequence[torch.Tensor],
    g: Sequence[torch.Tensor],
    vnorm: Sequence[torch.Tensor],
    window: Sequence[int],
    n: int | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Raw (unstandardised) features ``[P, len(window) * Hv * 3 + 3]`` float32 of one attention layer.

    beta / g / vnorm: per GDN ordinal ``[n, Hv]`` (as :meth:`ParentSession.signals` gives them); window: GDN
    ordinals (:func:`window_ordinals`); positions: 0-based context positions (default all). ``n`` defaults
    to the signals' length and is the context length in the age features.
    """
    if n is None:
        n = (beta[window[0]] if window else beta[0]).shape[0]
    idx = positions
    parts = []
    for o in window:
        b, gg, v = beta[o], g[o], vnorm[o]
        if idx is not None:
            b, gg, v = b[idx], gg[idx], v[idx]
        parts.append(torch.stack([b.float(), gg.float(), v.float()], dim=-1).flatten(1))  # [P, Hv*3]
    dev = beta[0].device if len(beta) else None
    pos = idx.to(dev) if idx is not None else None
    parts.append(age_features(n, pos, device=dev))
    return torch.cat(parts, dim=1)
