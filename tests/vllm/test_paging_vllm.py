"""kvbench's kernel-block arithmetic (:mod:`kvbench.engines.paging`) against vLLM's own: the block table that
``AttentionGroup.map_to_kernel_block_table`` (what vLLM's GPU model runner hands the attention backends when a
kernel block is smaller than the KV-cache manager's) makes of a manager block table, with a ratio above 1."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here: these tests run in .venv-vllm (scripts/setup_vllm.sh)")

from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402
from vllm.v1.worker.utils import AttentionGroup  # noqa: E402

from kvbench.engines.paging import KernelPaging  # noqa: E402


def _vllm_group(manager_block: int, kernel_block: int, stride: int, width: int) -> AttentionGroup:
    spec = FullAttentionSpec(block_size=manager_block, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    group = AttentionGroup(backend=None, layer_names=["attn"], kv_cache_spec=spec, kv_cache_group_id=0)
    group.kernel_block_size = kernel_block
    group.kernel_block_stride = stride
    group.kernel_block_table = torch.zeros(1, 1, width * (manager_block // kernel_block), dtype=torch.int32)
    group.kernel_block_offsets = torch.arange(manager_block // kernel_block, dtype=torch.int32)
    return group


@pytest.mark.parametrize(("manager_block", "kernel_block", "stride"), [(64, 16, 0), (544, 32, 0), (64, 16, 6)])
def test_kernel_rows_equal_vllms_kernel_block_table(manager_block, kernel_block, stride):
    block_ids = [5, 0, 9, 3]
    group = _vllm_group(manager_block, kernel_block, stride, len(block_ids))
    table = torch.tensor([block_ids], dtype=torch.int32)
    mapped = group.map_to_kernel_block_table(table)[0].tolist()
    assert KernelPaging(manager_block, kernel_block, stride).rows(block_ids) == mapped


def test_slots_address_the_kernel_blocks_vllm_maps():
    """A token's slot lies in the kernel block that vLLM's mapped table lists for its position."""
    paging = KernelPaging(64, 16)
    block_ids = [4, 1]
    mapped = _vllm_group(64, 16, 0, 2).map_to_kernel_block_table(torch.tensor([block_ids], dtype=torch.int32))[0]
    slots = paging.slots(block_ids, 0, 128)
    for pos, slot in enumerate(slots.tolist()):
        assert slot // 16 == int(mapped[pos // 16]) and slot % 16 == pos % 16
