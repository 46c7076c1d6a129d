"""``full``: no eviction. Runs once per context at p = 1.0; its child keeps every entry."""

from __future__ import annotations

import torch

from kvbench.methods import EvictionMethod, register_method


@register_method
class Full(EvictionMethod):
    """The no-prune reference. At p = 1.0 every allocation keeps every entry, so scores are irrelevant."""

    name = "full"
    fixed_p = 1.0

    def score(self, parent):
        return [torch.zeros(parent.n_kv_heads, parent.n) for _ in range(parent.n_attn_layers)]
