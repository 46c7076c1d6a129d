"""Engine-conformance suite (DESIGN.md, "The protocol"), run over both model families.

Independent references are built from stock transformers ("sdpa" attention, the library's own masks)
with the same weights, so the kvbench attention function, cache surgery and greedy loop are checked
against code kvbench does not own.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvbench import budgets, selection
from kvbench.engines.attention import ATTN_IMPL, RaggedKV, kvbench_sdpa
from kvbench.engines.torch_engine import TorchEngine
from kvbench.errors import KvbenchError, ProtocolError
from kvbench.run.plan import RunConfig
from tests.conftest import tiny_model
from tests.fakes import MaskingTorchEngine

N_CTX = 300  # not a multiple of the GDN chunk (64): same-split references must still match exactly
Q_IDS = [17, 23, 5, 99, 42, 7, 31]
NEW = 10


def _ids(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


def _stock(family: str) -> torch.nn.Module:
    """The same weights under the stock transformers SDPA attention."""
    model = tiny_model(family)
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(model.config), attn_implementation="sdpa")
    ref.load_state_dict(model.state_dict())
    ref.config._attn_implementation = "sdpa"
    return ref.eval()


_STOCK: dict[str, torch.nn.Module] = {}


def stock(family: str) -> torch.nn.Module:
    if family not in _STOCK:
        _STOCK[family] = _stock(family)
    return _STOCK[family]


@torch.no_grad()
def stock_greedy(model, cache, question, start, new, masks=None, one_by_one=False):
    """Reference greedy loop on a stock model. ``masks(q_len, kv_len)`` gives an attention_mask dict."""
    logits, tokens = [], []
    pos = start
    feeds = [[t] for t in question] if one_by_one else [question]
    for step in range(new + len(feeds) - 1):
        ids = feeds[step] if step < len(feeds) else [tokens[-1]]
        kv = cache.layers[tiny_attn_ids(model)[0]].keys.shape[2] + len(ids)
        kwargs = {"attention_mask": masks(len(ids), kv)} if masks else {}
        out = model(
            input_ids=torch.tensor([ids]),
            cache=cache,
            use_cache=True,
            position_ids=torch.arange(pos, pos + len(ids))[None],
            **kwargs,
        )
        pos += len(ids)
        if step >= len(feeds) - 1:
            logits.append(out.logits[0, -1].float())
            tokens.append(int(out.logits[0, -1].argmax()))
    return tokens, torch.stack(logits)


def tiny_attn_ids(model) -> list[int]:
    return [i for i, t in enumerate(model.config.layer_types) if t == "full_attention"]


def stock_prefill(family: str, ids: list[int]):
    with torch.no_grad():
        return stock(family)(input_ids=torch.tensor([ids]), use_cache=True).cache


def gather_cache(cache, kept_per_layer):
    """Stock cache with every attention layer gathered to ``kept_per_layer[f]`` ([H_kv, K] indices)."""
    cache = copy.deepcopy(cache)
    for f, layer_idx in enumerate(i for i, layer in enumerate(cache.layers) if hasattr(layer, "keys")):
        layer = cache.layers[layer_idx]
        idx = kept_per_layer[f][None, :, :, None].expand(1, -1, -1, layer.keys.shape[-1])
        layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)
    return cache


def _answer(session, sha, question=Q_IDS, new=NEW):
    return session.answer(question, max_new_tokens=new, context_sha256=sha, stop_ids=(), return_logits=True)


# --- identity -------------------------------------------------------------------------------------------


def test_keep_all_child_is_token_identical_to_parent(engine):
    parent = engine.prefill(_ids(N_CTX), prot=8)
    ref = _answer(parent, parent.sha256)
    child = parent.fork(selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads))
    got = _answer(child, parent.sha256)
    assert got.token_ids == ref.token_ids and len(got.token_ids) == NEW
    assert torch.equal(got.step_logits, ref.step_logits)


def test_parent_matches_stock_transformers_same_split(family, engine):
    ids = _ids(N_CTX, seed=1)
    parent = engine.prefill(ids, prot=0)
    ours = _answer(parent, parent.sha256)
    ref_tokens, ref_logits = stock_greedy(stock(family), stock_prefill(family, ids), Q_IDS, N_CTX, NEW)
    assert ours.token_ids == ref_tokens
    torch.testing.assert_close(ours.step_logits, ref_logits, atol=2e-4, rtol=1e-4)
    for f, layer_idx in enumerate(parent.attn_layer_ids):
        torch.testing.assert_close(parent.keys(f), stock_prefill(family, ids).layers[layer_idx].keys[0])


def test_second_question_equals_question_alone(engine):
    """GDN states and attention caches are restored before every question."""
    parent = engine.prefill(_ids(N_CTX, seed=2), prot=4)
    k = selection.select_per_head(
        [torch.rand(parent.n_kv_heads, parent.n) for _ in range(parent.n_attn_layers)],
        [150] * parent.n_attn_layers,
        parent.prot,
    )
    child = parent.fork(k)
    alone = _answer(child, parent.sha256, question=[9, 8, 7])
    _answer(child, parent.sha256)  # Q1
    after = _answer(child, parent.sha256, question=[9, 8, 7])
    assert after.token_ids == alone.token_ids and torch.equal(after.step_logits, alone.step_logits)
    p_alone = _answer(parent, parent.sha256, question=[9, 8, 7])
    _answer(parent, parent.sha256)
    assert torch.equal(_answer(parent, parent.sha256, question=[9, 8, 7]).step_logits, p_alone.step_logits)


# --- pruned children against stock references ------------------------------------------------------------


def _random_kept(parent, counts, seed):
    g = torch.Generator().manual_seed(seed)
    return [
        [torch.sort(torch.randperm(parent.n, generator=g)[:c]).values for _ in range(parent.n_kv_heads)] for c in counts
    ]


def test_different_counts_per_layer_multi_token_question(family, engine):
    """Block-fed question on layers of different lengths == stock model fed one token at a time."""
    ids = _ids(N_CTX, seed=3)
    parent = engine.prefill(ids, prot=0)
    counts = [40, 170, 299][: parent.n_attn_layers]
    kept = _random_kept(parent, counts, seed=0)  # per-head different index sets too
    got = _answer(parent.fork(kept), parent.sha256)
    ref_cache = gather_cache(stock_prefill(family, ids), [torch.stack(k) for k in kept])
    ref_tokens, ref_logits = stock_greedy(stock(family), ref_cache, Q_IDS, N_CTX, NEW, one_by_one=True)
    assert got.token_ids == ref_tokens
    torch.testing.assert_close(got.step_logits, ref_logits, atol=2e-4, rtol=1e-4)


def test_per_head_index_sets_equal_counts(family, engine):
    ids = _ids(N_CTX, seed=4)
    parent = engine.prefill(ids, prot=0)
    kept = _random_kept(parent, [120] * parent.n_attn_layers, seed=1)
    assert not torch.equal(kept[0][0], kept[0][1])
    got = _answer(parent.fork(kept), parent.sha256)
    ref_cache = gather_cache(stock_prefill(family, ids), [torch.stack(k) for k in kept])
    ref_tokens, ref_logits = stock_greedy(stock(family), ref_cache, Q_IDS, N_CTX, NEW)
    assert got.token_ids == ref_tokens
    torch.testing.assert_close(got.step_logits, ref_logits, atol=2e-4, rtol=1e-4)


def test_unequal_per_head_counts_are_stored_ragged(family, engine):
    """Heads keeping different counts (global allocation): stored without padding (exactly the kept bytes),
    answers token-identical to the padded path. Reference: stock SDPA with an explicit per-head 4-D mask over
    the cache padded to the largest head (what the torch engine stored before)."""
    ids = _ids(N_CTX, seed=5)
    parent = engine.prefill(ids, prot=0)
    g = torch.Generator().manual_seed(2)
    sizes = [90, 140]
    heads = [torch.sort(torch.randperm(parent.n, generator=g)[:s]).values for s in sizes]
    kept = [heads for _ in range(parent.n_attn_layers)]  # same sets in every layer: one mask serves all
    child = parent.fork(kept)
    s = child.stats
    assert s.kept_entries == sum(sizes) * parent.n_attn_layers and not s.padded and s.real_fork
    entry_bytes = 2 * parent.head_dim * parent.keys(0).element_size()
    assert s.stored_bytes == s.kept_entries * entry_bytes  # no padding: exactly the kept entries
    got = _answer(child, parent.sha256)

    width = max(sizes)
    index = torch.zeros(parent.n_kv_heads, width, dtype=torch.long)
    valid = torch.zeros(parent.n_kv_heads, width, dtype=torch.bool)
    for h, idx in enumerate(heads):
        index[h, : len(idx)], valid[h, : len(idx)] = idx, True
    ref_cache = gather_cache(stock_prefill(family, ids), [index] * parent.n_attn_layers)
    n_rep = parent.n_heads // parent.n_kv_heads

    def masks(q_len, kv_len):
        ok = torch.ones(parent.n_kv_heads, kv_len, dtype=torch.bool)
        ok[:, :width] = valid
        causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
        full = (causal[None] & ok[:, None]).repeat_interleave(n_rep, 0)[None]
        return {"full_attention": full, "linear_attention": None}

    ref_tokens, ref_logits = stock_greedy(stock(family), ref_cache, Q_IDS, N_CTX, NEW, masks=masks)
    assert got.token_ids == ref_tokens
    torch.testing.assert_close(got.step_logits, ref_logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("q_len", [1, 3])
def test_ragged_attention_against_explicit_softmax(q_len):
    """Ragged per-head attention == an explicit per-head softmax over that head's kept entries then the
    entries fed after the context (bottom-right causal), one head keeping nothing."""
    torch.manual_seed(0)
    H, H_kv, extra, D = 4, 2, 3, 8
    counts = [0, 5]
    packed_k, packed_v = torch.randn(sum(counts), D), torch.randn(sum(counts), D)
    ragged = RaggedKV(packed_k, packed_v, counts).with_room(extra)
    query, key, value = torch.randn(1, H, q_len, D), torch.randn(1, H_kv, extra, D), torch.randn(1, H_kv, extra, D)

    class Mod:
        kvbench_ragged = ragged
        kvbench_query_sink = None

    out, _ = kvbench_sdpa(Mod(), query, key, value, None, scaling=D**-0.5)
    offsets = [0, counts[0], sum(counts)]
    for h in range(H):
        kvh = h // (H // H_kv)
        keys = torch.cat([packed_k[offsets[kvh] : offsets[kvh + 1]], key[0, kvh]])
        values = torch.cat([packed_v[offsets[kvh] : offsets[kvh + 1]], value[0, kvh]])
        for t in range(q_len):
            visible = len(keys) - q_len + t + 1
            w = torch.softmax(keys[:visible] @ query[0, h, t] * D**-0.5, 0)
            torch.testing.assert_close(out[0, t, h], w @ values[:visible], atol=1e-5, rtol=1e-5)


def test_ragged_room_copies_the_kept_entries_once_and_bounds_what_is_fed():
    """with_room: new storage holding the kept entries, the child's untouched by feeding; append writes the fed
    entries after each head's kept ones (and after those fed before), head_with_fed returns both; more than the
    room is an error."""
    torch.manual_seed(1)
    counts, D = [2, 4], 3
    packed_k, packed_v = torch.randn(sum(counts), D), torch.randn(sum(counts), D)
    child = RaggedKV(packed_k.clone(), packed_v.clone(), counts)
    work = child.with_room(2)
    assert work.keys.shape == (sum(counts) + 2 * 2, D) and work.keys.data_ptr() != child.keys.data_ptr()
    fed_k, fed_v = torch.randn(2, 2, D), torch.randn(2, 2, D)  # [H_kv, t, D]
    work.append(fed_k[:, :1], fed_v[:, :1])
    k0, _ = work.head_with_fed(0)
    assert torch.equal(k0, torch.cat([packed_k[:2], fed_k[0, :1]]))
    work.append(fed_k[:, 1:], fed_v[:, 1:])
    k, v = work.head_with_fed(1)
    assert torch.equal(k, torch.cat([packed_k[2:], fed_k[1]])) and torch.equal(v, torch.cat([packed_v[2:], fed_v[1]]))
    assert torch.equal(work.head_with_fed(0)[0], torch.cat([packed_k[:2], fed_k[0]]))
    assert torch.equal(work.head_keys(1), packed_k[2:])  # head 0's room is not head 1's entries
    assert torch.equal(child.keys, packed_k) and torch.equal(child.values, packed_v)
    with pytest.raises(ValueError, match="room for 2"):
        work.append(torch.randn(2, 1, D), torch.randn(2, 1, D))
    with pytest.raises(ValueError, match="need"):
        RaggedKV(packed_k, packed_v, counts, room=1)


@pytest.mark.parametrize("ragged", [False, True])
def test_answers_leave_the_child_storage_as_forked(engine, ragged):
    """Answering writes into per-answer copies: the child's kept tensors are unchanged, and a second answer of the
    same question is the same (nothing fed before leaks into it)."""
    parent = engine.prefill(_ids(N_CTX, seed=9), prot=4)
    scores = [torch.rand(parent.n_kv_heads, parent.n) for _ in range(parent.n_attn_layers)]
    kept = selection.select_per_head(scores, [120] * parent.n_attn_layers, parent.prot)
    if ragged:
        kept = [[idx if h else idx[:-7] for h, idx in enumerate(heads)] for heads in kept]
    child = parent.fork(kept)
    assert any(isinstance(kv, RaggedKV) for kv in child.layers) == ragged
    before = [t.clone() for kv in child.layers for t in (kv.tensors() if isinstance(kv, RaggedKV) else kv)]
    first, second = _answer(child, parent.sha256), _answer(child, parent.sha256)
    after = [t for kv in child.layers for t in (kv.tensors() if isinstance(kv, RaggedKV) else kv)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert first.token_ids == second.token_ids and torch.equal(first.step_logits, second.step_logits)


# --- memory ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.9, 0.5, 0.1])
def test_bytes_freed_match_evicted_share(engine, p):
    parent = engine.prefill(_ids(N_CTX, seed=6), prot=20)
    scores = [torch.rand(parent.n_kv_heads, parent.n) for _ in range(parent.n_attn_layers)]
    k = budgets.per_head_budget(parent.n, parent.prot, p)
    child = parent.fork(selection.select_per_head(scores, [k] * parent.n_attn_layers, parent.prot))
    s = child.stats
    assert s.stored_bytes * parent.n == s.full_bytes * (parent.prot + k)
    assert s.freed_bytes == s.full_bytes - s.stored_bytes > 0
    assert s.kept_entries == (parent.prot + k) * parent.n_kv_heads * parent.n_attn_layers
    assert s.real_fork and not s.padded


def test_global_allocation_stores_exactly_the_kept_bytes(engine):
    """A real run's skew: KVzip scores, global allocation at p = 0.5 and 0.1; per-head counts differ and the
    child's storage is the kept entries' bytes (the padded layout would store each layer's widest head)."""
    from kvbench.methods import get_method
    from kvbench.models import byte_tokenizer

    engine = TorchEngine(engine.model, byte_tokenizer())
    parent = engine.prefill(_ids(N_CTX, seed=9), prot=8)
    method = get_method("kvzip")
    method.chunk_size = 128
    scores = method.score(parent)
    entry_bytes = 2 * parent.head_dim * parent.keys(0).element_size()
    for p in (0.5, 0.1):
        kept = method.select(parent, scores, p, "global")
        padded = sum(max(len(i) for i in heads) * len(heads) for heads in kept) * entry_bytes
        child = parent.fork(kept)
        s = child.stats
        assert s.real_fork and s.stored_bytes == s.kept_entries * entry_bytes < padded
        child.release()


def test_masking_engine_forks_are_not_real_and_reports_exclude_them(tmp_path, monkeypatch):
    """An engine that only masks (tests/fakes.py) answers like a real fork, but its child holds the parent's
    storage: real_fork is false in its stats, in the rows the runner writes, and the report drops them."""
    from kvbench.models import load_model
    from kvbench.report import render_markdown, summarize
    from kvbench.run import loop as runner

    lm = load_model("tiny-random")
    named = {"fingerprint": lm.fingerprint}  # the loaded checkpoint's own name (its files), as the runner gives it
    masking, real = MaskingTorchEngine(lm.model, lm.tokenizer, **named), TorchEngine(lm.model, lm.tokenizer, **named)
    ids = _ids(N_CTX, seed=10)
    scores = [torch.rand(2, N_CTX, generator=torch.Generator().manual_seed(3)) for _ in range(3)]
    kept = selection.select_per_head(scores, [100] * 3, 4)
    children = [eng.prefill(ids, prot=4).fork(kept) for eng in (masking, real)]
    (masked_answer, real_answer) = (_answer(c, c.parent.sha256) for c in children)
    assert masked_answer.token_ids == real_answer.token_ids
    assert not children[0].stats.real_fork and children[1].stats.real_fork

    out = tmp_path / "run"
    config = RunConfig(methods=["random"], bench="needle", ps=[0.5], out=out, model="tiny-random", limit=1, length=900)
    monkeypatch.setattr(runner, "make_engine", lambda *a, **k: MaskingTorchEngine(lm.model, lm.tokenizer, **named))
    runner.run(config, lm=lm)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert rows and all(r["real_fork"] is False for r in rows)
    assert summarize(rows).empty
    assert f"0 rows used ({len(rows)} excluded: not a real compacted fork)" in render_markdown(rows)


# --- signals, gates, queries ------------------------------------------------------------------------------


def test_signals_and_gates_match_module_hooks(family, engine):
    """beta / g from the GDN input projections and the gate from q_proj, via plain forward hooks."""
    ids = _ids(200, seed=7)
    model = engine.model
    seen: dict = {}
    handles = []
    for _name, mod in model.named_modules():
        if type(mod).__name__.endswith("GatedDeltaNet"):
            for proj in ("in_proj_ba", "in_proj_b", "in_proj_a", "in_proj_qkvz"):
                if hasattr(mod, proj):
                    handles.append(
                        getattr(mod, proj).register_forward_hook(
                            lambda m, i, o, key=(mod.layer_idx, proj): seen.__setitem__(key, o.detach())
                        )
                    )
    try:
        parent = engine.prefill(ids, prot=0)
    finally:
        for h in handles:
            h.remove()
    sig = parent.signals()
    assert len(sig.beta) == len(parent.gdn_layer_ids)
    for f, layer_idx in enumerate(parent.gdn_layer_ids):
        gdn = model.model.layers[layer_idx].linear_attn
        if (layer_idx, "in_proj_ba") in seen:
            _, _, _, _, b, a = gdn.fix_query_key_value_ordering(
                seen[(layer_idx, "in_proj_qkvz")], seen[(layer_idx, "in_proj_ba")]
            )
        else:
            b, a = seen[(layer_idx, "in_proj_b")], seen[(layer_idx, "in_proj_a")]
        torch.testing.assert_close(sig.beta[f], torch.sigmoid(b[0].float()))
        g = -gdn.A_log.float().exp() * torch.nn.functional.softplus(a[0].float() + gdn.dt_bias)
        torch.testing.assert_close(sig.g[f], g)
        assert sig.vnorm[f].shape == (200, gdn.num_v_heads) and bool((sig.vnorm[f] > 0).all())
    for f in range(parent.n_attn_layers):
        assert parent.gate(f).shape == (200, parent.n_heads)
    means = parent.gate_means()
    expected = [
        parent.gate(f).mean(0).view(parent.n_kv_heads, -1).max(1).values.mean().item()
        for f in range(parent.n_attn_layers)
    ]
    assert means == pytest.approx(expected)


def test_queries_equal_recomputation_from_layer_inputs(family, engine):
    """parent.queries == q_proj -> q/gate split -> q_norm -> RoPE of the attention layer's input."""
    ids = _ids(150, seed=8)
    model = engine.model
    inputs: dict = {}
    handles = [
        model.model.layers[i].self_attn.register_forward_pre_hook(
            lambda m, args, kwargs, i=i: inputs.__setitem__(i, (args, kwargs)), with_kwargs=True
        )
        for i in tiny_attn_ids(model)
    ]
    try:
        parent = engine.prefill(ids, prot=0, query_window=16)
    finally:
        for h in handles:
            h.remove()
    import sys

    for f, layer_idx in enumerate(parent.attn_layer_ids):
        attn = model.model.layers[layer_idx].self_attn
        args, kwargs = inputs[layer_idx]
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        cos, sin = kwargs["position_embeddings"]
        T, hd = hidden.shape[1], attn.head_dim
        q = attn.q_proj(hidden).view(1, T, -1, 2 * hd)[..., :hd]
        q = attn.q_norm(q).transpose(1, 2)
        rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        q, _ = rope(q, q, cos, sin)
        positions = [140, 149, 134]
        torch.testing.assert_close(parent.queries(f, positions), q[0][:, positions])
    with pytest.raises(KvbenchError, match="query_window"):
        parent.queries(0, [10])


# --- misuse ---------------------------------------------------------------------------------------------


def test_misuse_is_an_error():
    engine = TorchEngine(tiny_model("qwen3_next"))
    parent = engine.prefill(_ids(80), prot=2)
    all_kept = selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads)
    child = parent.fork(all_kept)
    parent.max_live_children = 1  # the torch engine holds several (tests/test_batched_answer.py); at the limit:
    with pytest.raises(ProtocolError, match="live child"):
        parent.fork(all_kept)
    with pytest.raises(ProtocolError, match="hash mismatch"):
        child.answer(Q_IDS, max_new_tokens=2, context_sha256="0" * 64)
    assert engine.session(child.session_id) is child
    child.release()
    with pytest.raises(ProtocolError, match="released"):
        child.answer(Q_IDS, max_new_tokens=2, context_sha256=parent.sha256)
    with pytest.raises(ProtocolError, match="released"):
        engine.session(child.session_id)
    second = parent.fork(all_kept)  # after release, forking again is fine
    parent.release()
    with pytest.raises(ProtocolError, match="released"):
        second.answer(Q_IDS, max_new_tokens=2, context_sha256=parent.sha256)
    with pytest.raises(ProtocolError, match="released"):
        parent.keys(0)
    with pytest.raises(ProtocolError, match="unknown session"):
        engine.session("nope")
    with pytest.raises(KvbenchError, match="empty context"):
        engine.prefill([], prot=0)
    with pytest.raises(KvbenchError, match="exceeds the model limit"):
        engine.prefill([1] * (engine.max_context + 1), prot=0)


def test_bad_kept_sets_are_rejected():
    engine = TorchEngine(tiny_model("qwen3_next"))
    parent = engine.prefill(_ids(50), prot=0)
    L, H = parent.n_attn_layers, parent.n_kv_heads
    good = selection.keep_all(50, L, H)
    bad_sets = {
        "layers": good[:-1],
        "heads": [heads[:-1] for heads in good],
        "outside": [[torch.tensor([0, 50])] * H] * L,
        "sorted": [[torch.tensor([3, 1])] * H] * L,
        "1-D LongTensor": [[torch.tensor([1.0])] * H] * L,
    }
    for match, kept in bad_sets.items():
        with pytest.raises(KvbenchError, match=match):
            parent.fork(kept)


def test_engine_uses_kvbench_attention(family):
    """A model is built (and loaded) with transformers' attention, and the torch engine switches it to kvbench's:
    the model loader imports no engine."""
    from kvbench.models import LOAD_ATTENTION, build_random
    from tests.conftest import FAMILIES

    model = build_random(FAMILIES[family](), seed=0)
    assert model.config._attn_implementation == LOAD_ATTENTION
    assert TorchEngine(model).model.config._attn_implementation == ATTN_IMPL


def test_attention_is_registered_explicitly_and_idempotently():
    """Importing the engine and the model loader registers nothing with transformers; register_attention() does,
    the same function under the same name however often it is called (a fresh interpreter: other tests
    register it in this one)."""
    code = (
        "from transformers import AttentionInterface\n"
        "import kvbench.engines.torch_engine, kvbench.models\n"
        "from kvbench.engines.attention import ATTN_IMPL, kvbench_sdpa, register_attention\n"
        "assert ATTN_IMPL not in AttentionInterface().valid_keys()\n"
        "assert register_attention() == register_attention() == ATTN_IMPL\n"
        "assert AttentionInterface()[ATTN_IMPL] is kvbench_sdpa\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
