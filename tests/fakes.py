"""A tensors-only stand-in for a ParentSession, for method unit tests on explicit small tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FakeParent:
    """keys ``[H_kv, n, D]`` per attention layer; optional queries ``[H, n, D]`` per layer (all positions)."""

    key_list: list[torch.Tensor]
    query_list: list[torch.Tensor] | None = None
    n_heads: int | None = None
    prot: int = 0

    def __post_init__(self) -> None:
        if self.n_heads is None:
            self.n_heads = self.query_list[0].shape[0] if self.query_list else self.n_kv_heads

    @property
    def n(self) -> int:
        return self.key_list[0].shape[1]

    @property
    def n_attn_layers(self) -> int:
        return len(self.key_list)

    @property
    def n_kv_heads(self) -> int:
        return self.key_list[0].shape[0]

    @property
    def head_dim(self) -> int:
        return self.key_list[0].shape[2]

    def keys(self, f: int) -> torch.Tensor:
        return self.key_list[f]

    def queries(self, f: int, positions) -> torch.Tensor:
        return self.query_list[f][:, list(positions)]
