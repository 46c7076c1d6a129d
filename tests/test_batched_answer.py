"""Batched answering (issue 32): several children of one parent answer a question in one batched greedy decode.

References: each child answering alone (``child.answer``, the paper's one-at-a-time protocol, itself checked
against stock transformers in tests/test_conformance.py) and, for the bucketed attention store, an explicit
per-row, per-head softmax. Batched and alone are compared token for token and at every step's logits.
"""

from __future__ import annotations

import json

import pytest
import torch

from kvbench import selection
from kvbench.engines.base import AnswerGroup
from kvbench.engines.batch_kv import BatchKV, bucket_bounds
from kvbench.engines.torch_engine import TorchEngine, TorchParent, share_groups
from kvbench.errors import KvbenchError, ProtocolError
from kvbench.models import load_model
from kvbench.run import loop as runner
from kvbench.run.plan import RunConfig
from tests.conftest import tiny_model

N_CTX = 300
Q_IDS = [17, 23, 5, 99, 42, 7, 31]
#: float32 step logits of a child in a batch against the child alone, absolute. Not bit for bit: the decode kernels
#: make a decoding step's attention and GDN step bit-identical batched and alone (tests/test_decode_kernel.py), but
#: the question block (a masked, padded SDPA) and the GEMMs over many rows round differently from one row's
#: (docs/engines.md). Measured on the tiny models (logits of magnitude about 5): at most 2.3e-4 on the MoE family,
#: 3.9e-5 on the others, with the kernels or SDPA; one visible padding slot moves some child's logits by 9e-4 to 6.
LOGITS_ATOL = 5e-4


def _ids(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


def _random_kept(parent, counts_per_layer, seed: int) -> list[list[torch.Tensor]]:
    """``counts_per_layer[f][h]`` random sorted context positions per layer ordinal and KV head."""
    g = torch.Generator().manual_seed(seed)
    return [[torch.randperm(parent.n, generator=g)[:c].sort().values for c in heads] for heads in counts_per_layer]


def assert_same_logits(got, want) -> None:
    """Every answer of ``got`` has the step logits of the same answer of ``want`` (``[steps, vocab]``, the step
    that picked a stop id included), within :data:`LOGITS_ATOL`."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.step_logits is not None and g.step_logits.shape == w.step_logits.shape, i
        torch.testing.assert_close(
            g.step_logits, w.step_logits, atol=LOGITS_ATOL, rtol=0, msg=lambda m, i=i: f"child {i}'s step logits: {m}"
        )


def _children(parent) -> list:
    """Children of every storage kind: keep-all, one count for all layers (flat), counts differing per layer
    (pyramid / gate), per KV head (global: ragged), a tiny budget, and the same kept sets twice."""
    L, H = parent.n_attn_layers, parent.n_kv_heads
    n = parent.n
    shapes = [
        None,  # keep everything
        [[150] * H] * L,
        [[200 - 60 * f] * H for f in range(L)],
        [[40 + 100 * h for h in range(H)] for _ in range(L)],
        [[3 + h + f for h in range(H)] for f in range(L)],
        [[n - 1] * H] * L,
    ]
    kept = [selection.keep_all(n, L, H) if s is None else _random_kept(parent, s, seed=i) for i, s in enumerate(shapes)]
    kept.append(kept[3])
    return [parent.fork(k) for k in kept]


@pytest.mark.parametrize("stop_mode", ["none", "early"])
def test_batched_answers_equal_one_at_a_time(family, stop_mode, decode_path):
    """float32: every child's batched answer is token for token its answer alone, and its step logits those alone
    within :data:`LOGITS_ATOL`, whatever its storage, also when children stop at different steps (stop ids taken
    from the serial answers, so some end early); with the decode-attention kernel and with SDPA."""
    engine = TorchEngine(tiny_model(family))
    parent = engine.prefill(_ids(N_CTX, seed=7), prot=4)
    children = _children(parent)
    stops: tuple[int, ...] = ()
    if stop_mode == "early":
        alone = [c.answer(Q_IDS, max_new_tokens=12, context_sha256=parent.sha256, stop_ids=()) for c in children]
        stops = tuple({a.token_ids[2 + i % 5] for i, a in enumerate(alone[:3])})
    kw = {"max_new_tokens": 12, "context_sha256": parent.sha256, "stop_ids": stops, "return_logits": True}
    serial = [c.answer(Q_IDS, **kw) for c in children]
    batched = parent.answer_children(children, Q_IDS, **kw)
    assert [a.token_ids for a in batched] == [a.token_ids for a in serial]
    assert [a.stopped for a in batched] == [a.stopped for a in serial]
    assert_same_logits(batched, serial)
    if stop_mode == "early":
        lengths = {len(a.token_ids) for a in serial}
        assert len(lengths) > 1 and any(a.stopped for a in serial)  # the batch really shrank mid-decode
    assert all(a.batch == len(children) for a in batched)
    assert len({a.seconds for a in batched}) == 1  # one batch: its wall time shared equally
    assert all(a.batch == 1 for a in serial)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_groups_of_several_contexts_and_questions_equal_one_at_a_time(family):
    """float32: children of two parents (contexts of different lengths, so different positions) answering
    different questions (different lengths and budgets) in one :meth:`answer_groups` call answer token for token
    as each alone, with the same step logits (:data:`LOGITS_ATOL`); every answer records the whole decode's size."""
    engine = TorchEngine(tiny_model(family))
    parents = [engine.prefill(_ids(N_CTX, seed=7), prot=4), engine.prefill(_ids(N_CTX - 37, seed=8), prot=2)]
    kids = [_children(parents[0]), _children(parents[1])[1:5]]
    questions = [(Q_IDS, 9), (Q_IDS[:3], 14), (Q_IDS[::-1] + [3, 4], 6)]
    plan = [(0, questions[0]), (1, questions[1]), (0, questions[2]), (1, questions[0])]
    stops = (int(_ids(1, seed=5)[0]),)
    groups = [AnswerGroup(parents[k], kids[k], q, new, parents[k].sha256) for k, (q, new) in plan]
    got = engine.answer_groups(groups, stop_ids=stops, return_logits=True)
    size = sum(len(g.children) for g in groups)
    for group, answers in zip(groups, got, strict=True):
        want = [
            c.answer(group.question_ids, max_new_tokens=group.max_new_tokens, context_sha256=group.context_sha256,
                     stop_ids=stops, return_logits=True)
            for c in group.children
        ]  # fmt: skip
        assert [a.token_ids for a in answers] == [a.token_ids for a in want]
        assert [a.stopped for a in answers] == [a.stopped for a in want]
        assert_same_logits(answers, want)
        assert all(a.batch == size for a in answers)
    assert {len(a.token_ids) for answers in got for a in answers} >= {6, 9}  # budgets are per group


def test_answer_groups_refuses_a_foreign_parent_and_a_wrong_hash():
    engine, other = TorchEngine(tiny_model("qwen3_next")), TorchEngine(tiny_model("qwen3_next"))
    parent, stranger = engine.prefill(_ids(60), prot=2), other.prefill(_ids(60), prot=2)
    kept = selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads)
    mine, theirs = [parent.fork(kept), parent.fork(kept)], [stranger.fork(kept)]
    with pytest.raises(ProtocolError, match="not a session of this engine"):
        engine.answer_groups(
            [
                AnswerGroup(parent, mine, Q_IDS, 2, parent.sha256),
                AnswerGroup(stranger, theirs, Q_IDS, 2, stranger.sha256),
            ]
        )
    with pytest.raises(ProtocolError, match="hash mismatch"):
        engine.answer_groups([AnswerGroup(parent, mine, Q_IDS, 2, stranger.sha256 + "0")] * 2)


def test_one_child_takes_the_one_at_a_time_path():
    engine = TorchEngine(tiny_model("qwen3_next"))
    parent = engine.prefill(_ids(N_CTX), prot=0)
    child = parent.fork(selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads))
    (got,) = parent.answer_children([child], Q_IDS, max_new_tokens=5, context_sha256=parent.sha256, return_logits=True)
    want = child.answer(Q_IDS, max_new_tokens=5, context_sha256=parent.sha256, return_logits=True)
    assert got.batch == 1 and got.token_ids == want.token_ids
    assert torch.equal(got.step_logits, want.step_logits)  # the same path: bit for bit
    (plain,) = parent.answer_children([child], Q_IDS, max_new_tokens=5, context_sha256=parent.sha256)
    assert plain.step_logits is None  # only when asked for


def test_batched_answer_leaves_parent_and_children_unchanged():
    """The batch works on copies: answering twice gives the same tokens, and a child alone afterwards too."""
    engine = TorchEngine(tiny_model("qwen3_5"))
    parent = engine.prefill(_ids(N_CTX, seed=3), prot=2)
    children = _children(parent)[:4]
    first = parent.answer_children(children, Q_IDS, max_new_tokens=6, context_sha256=parent.sha256)
    again = parent.answer_children(children, Q_IDS, max_new_tokens=6, context_sha256=parent.sha256)
    alone = children[2].answer(Q_IDS, max_new_tokens=6, context_sha256=parent.sha256)
    assert [a.token_ids for a in first] == [a.token_ids for a in again]
    assert alone.token_ids == first[2].token_ids
    assert all(a.step_logits is None for a in first)  # logits only when asked for


def test_several_live_children_and_their_misuse():
    engine = TorchEngine(tiny_model("qwen3_next"))
    parent, other = engine.prefill(_ids(80), prot=2), engine.prefill(_ids(80, seed=1), prot=2)
    kept = selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads)
    a, b = parent.fork(kept), parent.fork(kept)
    assert parent.live_children() == [a, b]
    stranger = other.fork(kept)
    with pytest.raises(ProtocolError, match="not a child of parent"):
        parent.answer_children([a, stranger], Q_IDS, max_new_tokens=2, context_sha256=parent.sha256)
    with pytest.raises(ProtocolError, match="hash mismatch"):
        parent.answer_children([a, b], Q_IDS, max_new_tokens=2, context_sha256=other.sha256)
    b.release()
    with pytest.raises(ProtocolError, match="released"):
        parent.answer_children([a, b], Q_IDS, max_new_tokens=2, context_sha256=parent.sha256)
    parent.max_live_children = 1  # an engine holding one child at a time (the vLLM engine) refuses a second
    with pytest.raises(ProtocolError, match="live child"):
        parent.fork(kept)
    parent.release()
    assert a.released  # releasing the parent releases every live child


def test_answer_batch_limit_counts_worst_case_memory(monkeypatch):
    """A quarter of the free memory over a worst-case child (full storage + full padded rows + GDN states)."""
    from kvbench.engines import torch_engine

    engine = TorchEngine(tiny_model("qwen3_next"))
    parent = engine.prefill(_ids(N_CTX), prot=0)
    per_position = sum(2 * k.numel() // parent.n * k.element_size() for k in map(parent.keys, range(3)))
    gdn = sum(
        t.numel() * t.element_size()
        for i in parent.gdn_layer_ids
        for states in (parent.cache.layers[i].conv_states, parent.cache.layers[i].recurrent_states)
        for t in states.values()
    )
    per_child = per_position * (2 * parent.n + 20 + 32) + gdn
    monkeypatch.setattr(torch_engine, "free_memory_bytes", lambda device: 4 * per_child * 10 + 3)
    assert parent.answer_batch_limit(20, 32) == 10
    forked = per_position * (parent.n + 20 + 32) + gdn  # the children exist: only their batch rows and states
    monkeypatch.setattr(torch_engine, "free_memory_bytes", lambda device: 4 * forked * 7 + 3)
    assert parent.answer_batch_limit(20, 32, forked=True) == 7
    monkeypatch.setattr(torch_engine, "free_memory_bytes", lambda device: 5)
    assert parent.answer_batch_limit(20, 32) == 1


# --- rows that share the leading GDN layers ----------------------------------------------------------------


def test_share_groups_hand_worked():
    # rows 0 and 2 stay in group 0 (same token); row 1 splits off it; row 3 (group 1) becomes group 2
    assert share_groups([0, 0, 0, 1], [5, 7, 5, 5]) == ([0, 0, 1], [0, 1, 0, 2])
    assert share_groups([0, 0], [3, 3]) == ([0], [0, 0])
    assert share_groups([1, 0], [3, 3]) == ([1, 0], [0, 1])  # new groups numbered by first row
    assert share_groups([], []) == ([], [])


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_leading_layers_run_once_per_distinct_history(family):
    """The layers before the first attention layer see one row per group of rows fed the same tokens: one row for
    the question block, then at decoding step i as many rows as there are distinct answers so far (tokens
    0 .. i) among the rows fed at that step; the first attention layer sees every row."""
    engine = TorchEngine(tiny_model(family))
    parent = engine.prefill(_ids(N_CTX, seed=7), prot=4)
    children = _children(parent)
    first_attn = engine.adapter.attn_layer_ids[0]
    assert engine.adapter.leading_gdn_layer_ids == list(range(first_attn)) and first_attn > 0
    seen: dict[int, list[int]] = {0: [], first_attn: []}  # rows each layer's token mixer was fed, per forward

    def record(i: int):
        return lambda module, args, kwargs: seen[i].append(kwargs["hidden_states"].shape[0])

    mixers = {0: engine.adapter.gdn[0], first_attn: engine.adapter.attn[0]}
    hooks = [mixers[i].register_forward_pre_hook(record(i), with_kwargs=True) for i in seen]
    try:
        new = 12
        got = parent.answer_children(children, Q_IDS, max_new_tokens=new, context_sha256=parent.sha256, stop_ids=())
    finally:
        for h in hooks:
            h.remove()
    tokens = [a.token_ids for a in got]
    want = [1] + [len({tuple(t[: i + 1]) for t in tokens}) for i in range(new - 1)]
    assert seen[0] == want
    assert seen[first_attn] == [len(children)] * new
    assert max(want) < len(children)  # some rows did share (identical kept sets answer alike)


# --- the bucketed attention store --------------------------------------------------------------------------


def test_bucket_bounds_hand_worked():
    # widths in batch order; a row opens a bucket when below 0.75 x the bucket's widest (or far above its narrowest)
    assert bucket_bounds([100, 90, 80, 70, 50, 40, 10]) == [(0, 3), (3, 4), (4, 6), (6, 7)]
    assert bucket_bounds([10, 100]) == [(0, 1), (1, 2)]
    assert bucket_bounds([5]) == [(0, 1)]
    assert bucket_bounds([]) == []


@pytest.mark.parametrize("q_len", [1, 3])
def test_batch_kv_against_explicit_softmax(q_len, decode_path):
    """Every row and query head attends to its own KV head's kept entries, then the entries fed after the context
    (bottom-right causal), whatever the bucket padding; a second feed appends; rows leaving keep the others."""
    torch.manual_seed(0)
    H, H_kv, D = 4, 2, 8
    counts = [[30, 12], [29, 0], [9, 10], [2, 1]]  # four rows, per KV head; one head keeps nothing
    rows = [[(torch.randn(c, D), torch.randn(c, D)) for c in heads] for heads in counts]
    batch = BatchKV(rows, extra=q_len + 2)
    assert len(batch.buckets) > 1  # padding is bounded: the rows do not all share one width
    fed: list[list[tuple[list, list]]] = [[([], []) for _ in range(H_kv)] for _ in rows]

    def feed_and_check(live: list[int], q: int) -> None:
        query = torch.randn(len(live), H, q, D)
        key, value = torch.randn(len(live), H_kv, q, D), torch.randn(len(live), H_kv, q, D)
        out = batch.attend(query, key, value, scale=D**-0.5)
        for r, row in enumerate(live):
            for h in range(H_kv):
                fed[row][h][0].extend(key[r, h])
                fed[row][h][1].extend(value[r, h])
            for head in range(H):
                kvh = head // (H // H_kv)
                keys = torch.cat([rows[row][kvh][0], torch.stack(fed[row][kvh][0])])
                values = torch.cat([rows[row][kvh][1], torch.stack(fed[row][kvh][1])])
                for t in range(q):
                    visible = len(keys) - q + t + 1
                    w = torch.softmax(keys[:visible] @ query[r, head, t] * D**-0.5, 0)
                    torch.testing.assert_close(out[r, head, t], w @ values[:visible], atol=1e-5, rtol=1e-5)

    feed_and_check([0, 1, 2, 3], q_len)
    feed_and_check([0, 1, 2, 3], 1)
    batch.select(torch.tensor([1, 3]))
    assert batch.size == 2
    feed_and_check([1, 3], 1)
    with pytest.raises(ValueError, match="room"):
        batch.attend(torch.randn(2, H, 1, D), torch.randn(2, H_kv, 1, D), torch.randn(2, H_kv, 1, D), None)


def test_arena_hands_out_disjoint_buffers_and_reuses_them(monkeypatch):
    from kvbench.engines import batch_kv

    monkeypatch.setattr(batch_kv, "ARENA_BLOCK_BYTES", 1000)
    arena = batch_kv.Arena()
    a = arena.empty((3, 5), torch.float32, torch.device("cpu"))  # 60 bytes
    b = arena.empty((2, 2), torch.float64, "cpu")
    c = arena.empty((40, 10), torch.float32, "cpu")  # 1600 bytes: a block of its own
    a.fill_(1), b.fill_(2), c.fill_(3)
    assert (a == 1).all() and (b == 2).all() and (c == 3).all()  # no overlap
    assert b.data_ptr() % 64 == 0 and a.is_contiguous() and c.shape == (40, 10)
    held = arena.nbytes
    arena.reset()
    again = [arena.empty(t.shape, t.dtype, "cpu") for t in (a, b, c)]
    assert arena.nbytes == held  # the same blocks, nothing new allocated
    assert [t.data_ptr() for t in again] == [t.data_ptr() for t in (a, b, c)]


def test_batch_kv_in_an_arena_equals_fresh_buffers():
    """The same rows in arena buffers (dirty from an earlier use) attend as in fresh ones; rows leave in place."""
    from kvbench.engines.batch_kv import Arena

    torch.manual_seed(1)
    D, H_kv = 8, 2
    rows = [[(torch.randn(c, D), torch.randn(c, D)) for c in heads] for heads in [[30, 12], [29, 3], [9, 10], [2, 1]]]
    arena = Arena()
    BatchKV(rows, extra=4, arena=arena).buckets[0].keys.fill_(float("nan"))  # leave garbage behind
    arena.reset()
    pooled, fresh = BatchKV(rows, extra=4, arena=arena), BatchKV(rows, extra=4)
    for keep in (None, torch.tensor([0, 2, 3]), torch.tensor([1, 2])):
        if keep is not None:
            pooled.select(keep), fresh.select(keep)
        q = torch.randn(pooled.size, 4, 1, D)
        k, v = torch.randn(pooled.size, H_kv, 1, D), torch.randn(pooled.size, H_kv, 1, D)
        torch.testing.assert_close(pooled.attend(q, k, v, None), fresh.attend(q, k, v, None), rtol=0, atol=0)


# --- the runner ---------------------------------------------------------------------------------------------


def _rows(out) -> dict:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {(r["method"], r["allocation"], r["p"], r["item"], r["question"]): r for r in rows}


def test_runner_batched_rows_equal_one_at_a_time_and_resume_each_other(tmp_path):
    """Every method kind (query-agnostic, ragged global allocation, query-aware oracle, keep-all; the slow test
    in tests/test_batched_models.py runs every built-in method on the shipped models): the rows of
    --answer-batch 1 and of the default batch hold the same predictions and scores; each row records its batch;
    a batched rerun into the one-at-a-time directory finds every row done (the identity ignores the batch)."""
    lm = load_model("tiny-random")
    base = dict(
        methods=["full", "random", "kvzip", "oracle"],
        bench="needle",
        ps=[0.5, 0.1],
        model="tiny-random",
        limit=1,
        length=640,
    )
    one, many = tmp_path / "one", tmp_path / "many"
    runner.run(RunConfig(**base, out=one, answer_batch=1), lm=lm)
    summary = runner.run(RunConfig(**base, out=many), lm=lm)
    serial, batched = _rows(one), _rows(many)
    assert serial.keys() == batched.keys() and summary.rows_written == len(serial)
    for key, row in serial.items():
        assert (batched[key]["prediction"], batched[key]["score"]) == (row["prediction"], row["score"]), key
    assert {r["answer_batch"] for r in serial.values()} == {1}
    sizes = {r["method"]: r["answer_batch"] for r in batched.values()}
    assert sizes["kvzip"] == 1 + 2 + 2  # full, random x2, kvzip x2 of one context together
    assert sizes["oracle"] == 2  # a query-aware method forks per question: its two p answer together
    again = runner.run(RunConfig(**base, out=one, answer_batch=3), lm=lm)
    assert again.rows_written == 0 and again.rows_skipped == len(serial)
    from kvbench.engines import decode_kernel

    runs = json.loads((many / "manifest.json").read_text())["runs"]
    assert runs[0]["decode_kernels"] == decode_kernel.status()  # what the decoding steps ran


def test_runner_pools_contexts_and_rows_equal_one_at_a_time(tmp_path):
    """Several contexts' children answer in one decode (--answer-contexts, default 4): the rows hold the
    predictions of --answer-batch 1; each row records the size of the decode it came from (all children of the
    pooled contexts); 2 splits 3 contexts into decodes of 2 and 1 contexts; 1 pools nothing."""
    lm = load_model("tiny-random")
    base = dict(methods=["full", "random"], bench="needle", ps=[0.5, 0.1], model="tiny-random", limit=3, length=640)
    runner.run(RunConfig(**base, out=tmp_path / "one", answer_batch=1), lm=lm)
    serial = _rows(tmp_path / "one")
    per_context = 3  # full + random at two p
    for contexts, sizes in ((None, {3 * per_context}), (2, {2 * per_context, per_context}), (1, {per_context})):
        out = tmp_path / f"pooled-{contexts}"
        summary = runner.run(RunConfig(**base, out=out, answer_contexts=contexts), lm=lm)
        rows = _rows(out)
        assert rows.keys() == serial.keys() and summary.contexts == 3
        for key, row in serial.items():
            assert (rows[key]["prediction"], rows[key]["score"]) == (row["prediction"], row["score"]), key
        assert {r["answer_batch"] for r in rows.values()} == sizes, contexts
    with pytest.raises(KvbenchError, match="--answer-contexts 0: need at least 1"):
        runner.run(RunConfig(**base, out=tmp_path / "zero", answer_contexts=0), lm=lm)
    with pytest.raises(KvbenchError, match="drop one of them"):
        runner.run(RunConfig(**base, out=tmp_path / "both", answer_contexts=2, answer_batch=3), lm=lm)


def test_runner_pool_bound_by_memory_and_released_on_error(tmp_path, monkeypatch):
    """A pool flushes before the next context's rows would pass the memory bound (here 4 rows: each context's 3
    answer alone); an error while answering releases every held parent and child and writes no row of them."""
    lm = load_model("tiny-random")
    base = dict(methods=["full", "random"], bench="needle", ps=[0.5, 0.1], model="tiny-random", limit=3, length=640)
    monkeypatch.setattr(TorchParent, "answer_batch_limit", lambda self, q, new, forked=False: 4)
    runner.run(RunConfig(**base, out=tmp_path / "bound", answer_contexts=3), lm=lm)
    assert {r["answer_batch"] for r in _rows(tmp_path / "bound").values()} == {3}
    live = []
    real_prefill = TorchEngine.prefill

    def prefill(self, *args, **kwargs):
        parent = real_prefill(self, *args, **kwargs)
        live.append(parent)
        return parent

    def broken(self, groups, stop_ids=None):
        raise KvbenchError("decode failed")

    monkeypatch.setattr(TorchParent, "answer_batch_limit", lambda self, q, new, forked=False: 100)
    monkeypatch.setattr(TorchEngine, "prefill", prefill)
    monkeypatch.setattr(TorchEngine, "answer_groups", broken)
    with pytest.raises(KvbenchError, match="decode failed"):
        runner.run(RunConfig(**base, out=tmp_path / "broken", answer_contexts=3), lm=lm)
    assert len(live) == 3 and all(p.released and not p.live_children() for p in live)
    assert not (tmp_path / "broken" / "results.jsonl").exists()


def test_runner_answer_batch_two_and_bad_values(tmp_path, monkeypatch):
    lm = load_model("tiny-random")
    base = dict(methods=["random"], bench="needle", ps=[0.5, 0.3, 0.1], model="tiny-random", limit=1, length=640)
    runner.run(RunConfig(**base, out=tmp_path / "two", answer_batch=2), lm=lm)
    assert sorted(r["answer_batch"] for r in _rows(tmp_path / "two").values()) == [1, 2, 2]
    with pytest.raises(KvbenchError, match="--answer-batch 0: need at least 1"):
        runner.run(RunConfig(**base, out=tmp_path / "zero", answer_batch=0), lm=lm)
    monkeypatch.setattr(TorchEngine, "batches_children", False)  # an engine without a batched decode (vLLM)
    with pytest.raises(KvbenchError, match="answers one child at a time"):
        runner.run(RunConfig(**base, out=tmp_path / "refused", answer_batch=2), lm=lm)
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())


# --- the shipped models ------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["tiny-trained", "tiny-trained-dense"])
def test_shipped_models_batched_equals_one_at_a_time(model):
    """float32, a real RULER item at the model's length: children of every allocation (flat, pyramid, gate,
    global's ragged heads) and of every kind of scorer answer the same tokens batched as alone."""
    from kvbench.methods import get_method
    from kvbench.models import cache_dir
    from kvbench.prompt import prompt_length, render
    from kvbench.tasks import get_bench

    lm = load_model(model)
    engine = TorchEngine(lm.model, lm.tokenizer, fingerprint=lm.fingerprint)
    bench = get_bench("ruler")
    bench.cache_dir = cache_dir() / bench.name
    items = bench.contexts(
        "niah_single_1", length=lm.context_length, limit=1, seed=3, prompt_length=prompt_length(lm.tokenizer)
    )
    rendered = render(lm.tokenizer, next(iter(items)), max_length=engine.max_context)
    parent = engine.prefill(rendered.context_ids, rendered.prot)
    settings = [("snapkv", "flat"), ("keydiff", "pyramid"), ("gatesight", "gate"), ("kvzip", "global")]
    children = [parent.fork(selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads))]
    for name, allocation in settings:
        method = get_method(name, 0)
        scores = method.score(parent)
        children += [parent.fork(method.select(parent, scores, p, allocation)) for p in (0.5, 0.1)]
    question = rendered.question_ids[0]
    kw = {"max_new_tokens": 24, "context_sha256": parent.sha256}
    serial = [c.answer(question, **kw).token_ids for c in children]
    batched = parent.answer_children(children, question, **kw)
    assert [a.token_ids for a in batched] == serial


def test_batch_kv_mask_of_a_block_hand_worked():
    """The bool mask of the generic (non-CPU) path for a block of q new queries: folded row ``r * q + i`` of a row's
    KV head sees that head's kept entries, every entry fed before the block, and the block's entries up to ``i``."""
    D, q, n_rep = 4, 2, 2
    rows = [[(torch.randn(c, D), torch.randn(c, D)) for c in heads] for heads in [[3, 1], [2, 3]]]
    batch = BatchKV(rows, extra=5)
    (bk,) = batch.buckets
    bk.filled = 1 + q  # one entry fed earlier, then this block
    mask = BatchKV._mask(bk, q, n_rep)
    width, length = 3, 3 + 1 + q
    for r, counts in enumerate([[3, 1], [2, 3]]):
        for h, count in enumerate(counts):
            for row in range(n_rep * q):
                i = row % q
                want = [j < count or width <= j <= width + 1 + i for j in range(length)]
                assert mask[r, h, row].tolist() == want
    bk.filled = 1
    assert BatchKV._mask(bk, 1, n_rep)[1, 1, 0].tolist() == [True, True, True, True]  # one query: padding only
    assert BatchKV._mask(bk, 1, n_rep)[0, 1, 0].tolist() == [True, False, False, True]
