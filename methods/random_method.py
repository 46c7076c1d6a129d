"""``random``: uniform random scores, seeded by (seed, context hash) so reruns are identical."""

from __future__ import annotations

import torch

from kvbench.methods import EvictionMethod, register_method


@register_method
class Random(EvictionMethod):
    """Keeps a uniformly random subset of each head's body entries (independent per layer and head).

    The generator is seeded with ``seed`` and the first 15 hex digits of the context's SHA-256, so two
    contexts get different subsets and a rerun gets the same ones.
    """

    name = "random"

    def score(self, parent):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(parent.sha256[:15], 16))
        return [torch.rand(parent.n_kv_heads, parent.n, generator=gen) for _ in range(parent.n_attn_layers)]
