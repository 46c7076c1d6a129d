"""kvbench_training.fast_gdn: the training-speed GDN chunk kernel gives transformers' values (outputs, final
state, gradients) and the token-by-token recurrence's, and the trainer uses it unless told not to."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as mq

from kvbench_training import fast_gdn
from tests.test_train_tiny import train_small


def _inputs(batch: int, length: int, k_heads: int, v_heads: int, dim: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, length, k_heads, dim, generator=gen)
    k = torch.randn(batch, length, k_heads, dim, generator=gen) * dim**-0.5  # |k| about 1: a stable recurrence
    v = torch.randn(batch, length, v_heads, dim, generator=gen)
    g = -torch.rand(batch, length, v_heads, generator=gen) * 0.5
    beta = torch.rand(batch, length, v_heads, generator=gen)
    state = torch.randn(batch, v_heads, dim, dim, generator=gen) * 0.1
    return [x.requires_grad_() for x in (q, k, v, g, beta, state)]


def _run(kernel, inputs, chunk_size: int, l2norm: bool):
    """Output, final state and the gradients of every input under a fixed random projection of both."""
    for x in inputs:
        x.grad = None
    q, k, v, g, beta, state = inputs
    kw = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=l2norm)
    if kernel is not mq.torch_recurrent_gated_delta_rule:
        kw["chunk_size"] = chunk_size
    out, final = kernel(q, k, v, g=g, beta=beta, **kw)
    gen = torch.Generator().manual_seed(1)
    loss = (out * torch.randn(out.shape, generator=gen)).sum() + (final * torch.randn(final.shape, generator=gen)).sum()
    loss.backward()
    return out.detach(), final.detach(), [x.grad.clone() for x in inputs]


@pytest.mark.parametrize(
    "batch,length,k_heads,v_heads,chunk_size,l2norm",
    [(1, 64, 1, 1, 16, True), (2, 75, 1, 2, 16, True), (1, 130, 2, 2, 32, False), (1, 9, 1, 2, 64, True)],
)
def test_outputs_state_and_gradients_match_the_fallback_and_the_recurrence(
    batch, length, k_heads, v_heads, chunk_size, l2norm
):
    """Lengths that are and are not a multiple of the chunk (padding), grouped value heads, an initial state."""
    inputs = _inputs(batch, length, k_heads, v_heads)
    fast = _run(fast_gdn.chunk_gated_delta_rule, inputs, chunk_size, l2norm)
    for reference in (mq.torch_chunk_gated_delta_rule, mq.torch_recurrent_gated_delta_rule):
        ref = _run(reference, inputs, chunk_size, l2norm)
        torch.testing.assert_close(fast[0], ref[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(fast[1], ref[1], rtol=1e-4, atol=1e-5)
        for mine, theirs in zip(fast[2], ref[2], strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


def test_a_wrong_kernel_would_fail_the_comparison():
    """The comparison above can fail: one chunk's decay dropped gives other outputs than the recurrence."""
    inputs = _inputs(1, 64, 1, 1)
    ref = _run(mq.torch_recurrent_gated_delta_rule, inputs, 16, True)
    q, k, v, g, beta, state = inputs
    no_decay = torch.zeros_like(g).requires_grad_()
    wrong = _run(fast_gdn.chunk_gated_delta_rule, [q, k, v, no_decay, beta, state], 16, True)
    assert not torch.allclose(wrong[0], ref[0], rtol=1e-4, atol=1e-5)


def test_install_and_restore_swap_the_kernel_of_both_architectures():
    import importlib

    modules = [importlib.import_module(name) for name in fast_gdn.MODULES]
    before = [m.torch_chunk_gated_delta_rule for m in modules]
    replaced = fast_gdn.install()
    try:
        assert all(m.torch_chunk_gated_delta_rule is fast_gdn.chunk_gated_delta_rule for m in modules)
    finally:
        fast_gdn.restore(replaced)
    assert [m.torch_chunk_gated_delta_rule for m in modules] == before


@pytest.mark.parametrize("reference", [False, True])
def test_the_trainer_uses_the_fast_kernel_unless_told_not_to(tmp_path, one_thread, monkeypatch, reference):
    calls = []
    kernel = fast_gdn.chunk_gated_delta_rule

    def counted(*args, **kw):
        calls.append(1)
        return kernel(*args, **kw)

    monkeypatch.setattr(fast_gdn, "chunk_gated_delta_rule", counted)
    before = mq.torch_chunk_gated_delta_rule
    train_small(tmp_path / "run", steps=2, reference_gdn=reference)
    assert (len(calls) == 0) == reference  # 3 GDN layers x 2 steps when fast
    assert mq.torch_chunk_gated_delta_rule is before  # restored after training
