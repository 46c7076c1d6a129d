"""kvbench's decode-attention kernel (kvbench/engines/decode_kernel.py, decode_attention.c).

References: an explicit float64 softmax per query row (the definition of attention), and the kernel itself on the
same logical entries laid out differently (one run or two, alone or among other jobs): the output of a job must
not depend on anything but its query rows and its entries, bit for bit.
"""

from __future__ import annotations

import logging
import platform

import pytest
import torch

from kvbench.engines import decode_kernel as dk


@pytest.fixture
def kernel_on(monkeypatch):
    monkeypatch.delenv("KVBENCH_DECODE_KERNEL", raising=False)
    dk._load.cache_clear()
    if dk._load()[0] is None:
        pytest.skip(f"optional: no C compiler here to build the kernel ({dk.status()})")
    yield
    dk._load.cache_clear()


def _reference(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """query ``[nq, D]``, keys / values ``[L, D]``: softmax(q k^T scale) v in float64."""
    w = torch.softmax(query.double() @ keys.double().T * scale, -1)
    return (w @ values.double()).float()


def _two_run_jobs(lengths, D, room, seed):
    """One buffer per job: ``n1`` random entries at rows 0.., ``n2`` more from row ``off2 = n1 + room`` on."""
    g = torch.Generator().manual_seed(seed)
    bufs = []
    for n1, n2 in lengths:
        off2 = n1 + room
        k, v = torch.randn(off2 + n2 + 1, D, generator=g), torch.randn(off2 + n2 + 1, D, generator=g)
        bufs.append((k, v, n1, off2, n2))
    jobs = dk.DecodeJobs(
        [b[0].data_ptr() for b in bufs], [b[1].data_ptr() for b in bufs], [b[2] for b in bufs], [b[3] for b in bufs],
        [b[4] for b in bufs],
    )  # fmt: skip
    return bufs, jobs


@pytest.mark.parametrize("D", [64, 128, 256, 48, 8])
@pytest.mark.parametrize("nq", [1, 2, 8])
def test_kernel_equals_explicit_softmax(kernel_on, D, nq):
    """Two runs per job (sizes 0, 1, 16, 17 and a long one), then an entry written in place and attended last."""
    lengths = [(0, 3), (1, 0), (16, 1), (17, 15), (700, 5), (33, 0)]
    bufs, jobs = _two_run_jobs(lengths, D, room=4, seed=D + nq)
    J = len(lengths)
    query = torch.randn(J, nq, D)
    new_k, new_v = torch.randn(J, D), torch.randn(J, D)
    scale = 0.7 * D**-0.5
    out = dk.decode_attention(query, jobs, scale, new_k, new_v)
    for j, (k, v, n1, off2, n2) in enumerate(bufs):
        assert torch.equal(k[off2 + n2], new_k[j]) and torch.equal(v[off2 + n2], new_v[j])  # written in place
        keys = torch.cat([k[:n1], k[off2 : off2 + n2 + 1]])
        values = torch.cat([v[:n1], v[off2 : off2 + n2 + 1]])
        torch.testing.assert_close(out[j], _reference(query[j], keys, values, scale), atol=2e-6, rtol=1e-5)


def test_a_job_depends_only_on_its_entries(kernel_on):
    """The same logical entries as one run or split in two at any point, computed alone or among other jobs:
    bit-identical outputs (what makes a child's batched decoding step equal its step alone)."""
    torch.manual_seed(3)
    D, nq, L = 64, 2, 301
    keys, values, query = torch.randn(L, D), torch.randn(L, D), torch.randn(1, nq, D)
    alone = dk.decode_attention(query, dk.DecodeJobs.heads(keys[None], values[None]), 0.125)
    for split in (0, 1, 15, 16, 150, L - 1, L):
        k = torch.cat([keys[:split], torch.full((9, D), float("nan")), keys[split:]])  # a gap that is never read
        v = torch.cat([values[:split], torch.full((9, D), float("nan")), values[split:]])
        jobs = dk.DecodeJobs([k.data_ptr()], [v.data_ptr()], [split], [split + 9], [L - split])
        assert torch.equal(dk.decode_attention(query, jobs, 0.125), alone)
    others = torch.randn(5, 40, D)
    crowd = dk.DecodeJobs(
        [others[0].data_ptr(), keys.data_ptr(), *(o.data_ptr() for o in others[1:])],
        [others[0].data_ptr(), values.data_ptr(), *(o.data_ptr() for o in others[1:])],
        [40, L, 40, 40, 40, 40], [0] * 6, [0] * 6,
    )  # fmt: skip
    queries = torch.randn(6, nq, D)
    queries[1] = query[0]
    assert torch.equal(dk.decode_attention(queries, crowd, 0.125)[1], alone[0])


def test_generic_path_equals_explicit_softmax(kernel_on):
    """The plain-C path (machines without AVX-512), built here with AVX-512 turned off."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the generic build flag below is x86's")
    kernel = dk._Kernel(dk._build(dk._compiler(), [*dk.FLAGS, "-mno-avx512f"]))
    assert kernel.path == "generic"
    bufs, jobs = _two_run_jobs([(20, 3), (0, 1), (64, 0)], 64, room=2, seed=5)
    query = torch.randn(3, 2, 64)
    out = dk.decode_attention(query, jobs, 0.125, kernel=kernel)
    for j, (k, v, n1, off2, n2) in enumerate(bufs):
        keys, values = torch.cat([k[:n1], k[off2 : off2 + n2]]), torch.cat([v[:n1], v[off2 : off2 + n2]])
        torch.testing.assert_close(out[j], _reference(query[j], keys, values, 0.125), atol=2e-6, rtol=1e-5)


def test_built_once_per_machine_and_source(kernel_on, monkeypatch, tmp_path):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path))
    first = dk._build(dk._compiler())
    assert first.parent == tmp_path / "kernels" and first.exists()
    stamp = first.stat().st_mtime_ns
    assert dk._build(dk._compiler()) == first and first.stat().st_mtime_ns == stamp  # found, not rebuilt
    assert dk._build(dk._compiler(), [*dk.FLAGS, "-DKVB_OTHER"]) != first  # other flags: another build
    assert not list(tmp_path.glob("kernels/*.tmp"))


def test_off_switch_and_a_broken_compiler_say_why(monkeypatch, caplog):
    monkeypatch.setenv("KVBENCH_DECODE_KERNEL", "0")
    dk._load.cache_clear()
    try:
        assert dk.status() == "pytorch (KVBENCH_DECODE_KERNEL=0)"
        monkeypatch.setattr(dk, "_warned", False)
        with caplog.at_level(logging.WARNING, logger="kvbench.engines.decode_kernel"):
            assert not dk.applies(torch.zeros(1, 4, 1, 8))
        assert caplog.text == ""  # turned off on purpose: nothing to warn about
        with pytest.raises(RuntimeError, match="off"):
            dk.decode_attention(torch.zeros(1, 1, 8), dk.DecodeJobs([0], [0], [0], [0], [0]), 1.0)
        monkeypatch.delenv("KVBENCH_DECODE_KERNEL")
        monkeypatch.setenv("CC", "/nonexistent/cc")
        dk._load.cache_clear()
        monkeypatch.setattr(dk, "_warned", False)
        with caplog.at_level(logging.WARNING, logger="kvbench.engines.decode_kernel"):
            assert not dk.available()
        assert dk.status().startswith("pytorch (kvbench's decode kernels failed to build or load")
        assert "/nonexistent/cc" in caplog.text and "point CC at a working one" in caplog.text
    finally:
        dk._load.cache_clear()


def test_refuses_what_it_cannot_attend(kernel_on):
    with pytest.raises(ValueError, match="contiguous"):
        dk.DecodeJobs.heads(torch.zeros(2, 8, 5).transpose(1, 2), torch.zeros(2, 5, 8))
    jobs = dk.DecodeJobs.heads(torch.zeros(2, 5, 8), torch.zeros(2, 5, 8))
    with pytest.raises(ValueError, match="float32"):
        dk.decode_attention(torch.zeros(2, 1, 8, dtype=torch.bfloat16), jobs, 1.0)
    with pytest.raises(ValueError, match="3 query jobs for 2"):
        dk.decode_attention(torch.zeros(3, 1, 8), jobs, 1.0)


def test_batched_step_is_bitwise_each_row_alone(kernel_on):
    """A decoding step of a bucketed batch (BatchKV, padding between rows' kept entries and their fed ones) gives
    every row exactly the attention output of that row's entries attended alone, contiguous."""
    from kvbench.engines.batch_kv import BatchKV

    torch.manual_seed(4)
    H, H_kv, D = 4, 2, 64
    counts = [[300, 120], [290, 0], [40, 50], [7, 3]]
    rows = [[(torch.randn(c, D), torch.randn(c, D)) for c in heads] for heads in counts]
    batch = BatchKV(rows, extra=6)
    fed_k, fed_v = torch.randn(len(rows), H_kv, 3, D), torch.randn(len(rows), H_kv, 3, D)
    batch.attend(torch.randn(len(rows), H, 3, D), fed_k, fed_v, None)  # a question block (SDPA)
    query = torch.randn(len(rows), H, 1, D)
    new_k, new_v = torch.randn(len(rows), H_kv, 1, D), torch.randn(len(rows), H_kv, 1, D)
    out = batch.attend(query, new_k, new_v, None)
    for r, heads in enumerate(rows):
        keys = [torch.cat([k, fed_k[r, h], new_k[r, h]]) for h, (k, _) in enumerate(heads)]
        values = [torch.cat([v, fed_v[r, h], new_v[r, h]]) for h, (_, v) in enumerate(heads)]
        jobs = dk.DecodeJobs([k.data_ptr() for k in keys], [v.data_ptr() for v in values], [len(k) for k in keys],
                             [0, 0], [0, 0])  # fmt: skip
        alone = dk.decode_step(query[r : r + 1], jobs, None)
        assert torch.equal(out[r : r + 1], alone)


def _gdn_inputs(B, Hk, Hv, Dk, Dv, T=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, Hk, Dk, generator=g), torch.randn(B, T, Hk, Dk, generator=g)
    v = torch.randn(B, T, Hv, Dv, generator=g)
    decay, beta = -torch.rand(B, T, Hv, generator=g), torch.rand(B, T, Hv, generator=g)
    state = torch.randn(B, Hv, Dk, Dv, generator=g)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("shape", [(3, 2, 2, 64, 64), (2, 2, 4, 32, 48), (1, 1, 1, 16, 16)])
@pytest.mark.parametrize("l2norm", [True, False])
def test_gdn_step_equals_transformers_recurrent_rule(kernel_on, shape, l2norm):
    """Against transformers' own one-token recurrence (the reference the GDN forward calls without the kernel),
    grouped value heads included; the input state is not written."""
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    q, k, v, decay, beta, state = _gdn_inputs(*shape)
    before = state.clone()
    ref_out, ref_state = hf.torch_recurrent_gated_delta_rule(
        q, k, v, g=decay, beta=beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=l2norm
    )
    out, new_state = dk.gdn_step(q, k, v, decay, beta, state, l2norm)
    assert torch.equal(state, before) and out.shape == ref_out.shape and new_state.shape == ref_state.shape
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(new_state, ref_state, atol=1e-5, rtol=1e-5)


def test_gdn_step_rows_are_independent(kernel_on):
    """A row's step is bitwise the same alone as among other rows (what keeps batched answers equal to lone ones)."""
    q, k, v, decay, beta, state = _gdn_inputs(5, 2, 2, 64, 64, seed=1)
    out, new_state = dk.gdn_step(q, k, v, decay, beta, state, True)
    for r in (0, 3):
        one = slice(r, r + 1)
        out_r, state_r = dk.gdn_step(q[one], k[one], v[one], decay[one], beta[one], state[one], True)
        assert torch.equal(out_r, out[one]) and torch.equal(state_r, new_state[one])


def test_decode_kernels_route_one_float32_token_and_restore(kernel_on):
    """Inside ``decode_kernels`` a one-token float32 call runs the kernel, a longer block transformers' function;
    leaving restores transformers' function."""
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    from kvbench.engines.hf_adapters import HybridAdapter
    from tests.conftest import tiny_model

    adapter = HybridAdapter(tiny_model("qwen3_next"))
    original = hf.torch_recurrent_gated_delta_rule
    one = _gdn_inputs(2, 2, 2, 64, 64, seed=2)
    two = _gdn_inputs(2, 2, 2, 64, 64, T=2, seed=3)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    with adapter.decode_kernels():
        patched = hf.torch_recurrent_gated_delta_rule
        assert patched is not original
        with adapter.decode_kernels():  # nested: nothing installed twice
            assert hf.torch_recurrent_gated_delta_rule is patched
        out, state = patched(*one[:3], g=one[3], beta=one[4], initial_state=one[5], **kw)
        assert all(torch.equal(a, b) for a, b in zip((out, state), dk.gdn_step(*one, True), strict=True))
        out2, state2 = patched(*two[:3], g=two[3], beta=two[4], initial_state=two[5], **kw)
        ref2 = original(*two[:3], g=two[3], beta=two[4], initial_state=two[5], **kw)
        assert torch.equal(out2, ref2[0]) and torch.equal(state2, ref2[1])
    assert hf.torch_recurrent_gated_delta_rule is original


def test_answers_step_gdn_layers_by_the_kernel(kernel_on, monkeypatch):
    """A child answering alone and children answering batched both take the GDN step kernel at every decoding
    step of every GDN layer, and the parent's end-of-context states stay as they were."""
    from kvbench import selection
    from kvbench.engines.torch_engine import TorchEngine
    from tests.conftest import tiny_model

    calls = []
    real = dk.gdn_step
    monkeypatch.setattr(dk, "gdn_step", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    engine = TorchEngine(tiny_model("qwen3_next"))
    parent = engine.prefill(list(range(3, 90)), prot=2)
    states = [s.clone() for s in parent.cache.layers[parent.gdn_layer_ids[0]].recurrent_states.values()]
    children = [parent.fork(selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads)) for _ in range(3)]
    alone = children[0].answer([5, 6, 7], max_new_tokens=4, context_sha256=parent.sha256, stop_ids=())
    n_gdn = len(parent.gdn_layer_ids)
    assert calls == [1] * n_gdn * (len(alone.token_ids) - 1)  # every step after the question block
    calls.clear()
    parent.answer_children(children, [5, 6, 7], max_new_tokens=4, context_sha256=parent.sha256, stop_ids=())
    steps, leading = len(alone.token_ids) - 1, len(engine.adapter.leading_gdn_layer_ids)
    assert sorted(calls) == sorted([1] * leading * steps + [3] * (n_gdn - leading) * steps)  # shared layers: one row
    after = list(parent.cache.layers[parent.gdn_layer_ids[0]].recurrent_states.values())
    assert all(torch.equal(a, b) for a, b in zip(states, after, strict=True))


def test_a_compiler_without_openmp_builds_a_one_thread_kernel(kernel_on, monkeypatch, tmp_path):
    """A compiler that refuses ``-fopenmp`` (Apple's clang, say) still gets the kernels, single-threaded."""
    import shutil

    real = dk._compiler()
    if shutil.which("bash") is None:
        pytest.skip("optional: the compiler stand-in below is a bash script")
    cc = tmp_path / "cc-no-openmp"
    cc.write_text(f'#!/usr/bin/env bash\nfor a in "$@"; do [[ $a == -fopenmp ]] && exit 1; done\nexec {real} "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    dk._load.cache_clear()
    assert dk.status().endswith(", one thread: no OpenMP)") and dk.available()
    bufs, jobs = _two_run_jobs([(30, 2), (5, 0)], 64, room=1, seed=6)
    query = torch.randn(2, 2, 64)
    out = dk.decode_attention(query, jobs, 0.125)
    for j, (k, v, n1, off2, n2) in enumerate(bufs):
        keys, values = torch.cat([k[:n1], k[off2 : off2 + n2]]), torch.cat([v[:n1], v[off2 : off2 + n2]])
        torch.testing.assert_close(out[j], _reference(query[j], keys, values, 0.125), atol=2e-6, rtol=1e-5)


def test_sdpa_function_decodes_keys_whose_rows_are_not_contiguous(kernel_on):
    """``kvbench_sdpa`` hands the kernel keys / values of any layout (copied when their rows are not contiguous)."""
    import types

    import torch.nn.functional as F

    from kvbench.engines.attention import kvbench_sdpa

    torch.manual_seed(7)
    query = torch.randn(1, 4, 1, 64)
    key = torch.randn(1, 300, 2, 64).transpose(1, 2)  # [1, H_kv, n, D], rows 128 floats apart
    value = torch.randn(1, 300, 2, 64).transpose(1, 2)
    out, _ = kvbench_sdpa(types.SimpleNamespace(), query, key, value, None, scaling=0.125)
    ref = F.scaled_dot_product_attention(query, key, value, scale=0.125, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
