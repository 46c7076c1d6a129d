"""The query-aware ``oracle`` and the runner's per-question path.

* the oracle's score of an entry equals a brute-force deletion: fork a child without that one entry, feed the
  same question + answer tokens, measure the change of the layer's ungated attention output (hooks on the
  model, nothing of the oracle's own code);
* on the trained tiny model the oracle keeps the needle on niah items at p = 0.1 and still answers;
* a query-aware method defined in this file runs through the same subclassing path and the runner: scored
  once per question, forked per (question, p), rows equal to a by-hand fork, ``query_aware`` on every row.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from kvbench import budgets
from kvbench.engines.torch_engine import TorchEngine
from kvbench.errors import KvbenchError
from kvbench.methods import (
    EvictionMethod,
    QueryAwareMethod,
    QuestionInput,
    get_method,
    method_class,
    register_method,
)
from kvbench.methods.kv_utility import recompute_attention
from kvbench.methods.oracle import Oracle, probe_with_values
from kvbench.models import load_model
from kvbench.prompt import prompt_length, render
from kvbench.run.loop import run, run_models
from kvbench.run.plan import RunConfig, check_models, validate
from kvbench.tasks import get_bench
from tests.conftest import tiny_model

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


# ----------------------------------------------------------------------------------------------------
# Brute-force deletion, measured on the model itself
# ----------------------------------------------------------------------------------------------------


def _ungated_rows(engine: TorchEngine, f: int, session, token_ids: list[int]) -> torch.Tensor:
    """Teacher-force ``token_ids`` after ``session``'s cache (one block, as an answer's first forward) and
    return attention layer ``f``'s ungated head outputs ``[T, H, D]`` (float64): ``o_proj``'s input divided
    by the output gate ``sigmoid`` of ``q_proj``'s second half."""
    mod = engine.adapter.attn[f]
    T, D = len(token_ids), mod.head_dim
    got: dict[str, torch.Tensor] = {}

    def pre(_m, args):
        got.setdefault("x", args[0].detach()[0].double())

    def gate(_m, _i, out):
        got.setdefault("g", out.detach()[0].double().view(T, -1, 2 * D)[..., D:])

    handles = [mod.o_proj.register_forward_pre_hook(pre), mod.q_proj.register_forward_hook(gate)]
    try:
        session.answer(token_ids, max_new_tokens=1, context_sha256=engine_parent(session).sha256)
    finally:
        for h in handles:
            h.remove()
    x = got["x"].view(T, -1, D)
    return x / torch.sigmoid(got["g"])


def engine_parent(session):
    return getattr(session, "parent", session)


def deletion_utility(engine, parent, f: int, h: int, i: int, token_ids: list[int], base: torch.Tensor) -> float:
    """``max_t || W_O (o_without_i(t) - o(t)) ||`` with entry ``i`` of (layer ``f``, KV head ``h``) physically
    left out of a fork (every other entry kept)."""
    everything = torch.arange(parent.n)
    kept = [[everything.clone() for _ in range(parent.n_kv_heads)] for _ in range(parent.n_attn_layers)]
    kept[f][h] = everything[everything != i]
    child = parent.fork(kept)
    try:
        without = _ungated_rows(engine, f, child, token_ids)
    finally:
        child.release()
    T = without.shape[0]
    w_o = engine.adapter.attn[f].o_proj.weight.detach().double()  # [hidden, H*D]
    change = (without - base).reshape(T, -1) @ w_o.T
    return change.norm(dim=-1).max().item()


def check_against_deletion(engine, parent, scores, forced, entries_per_head: int, gen) -> float:
    """Largest |oracle - deletion| / max oracle score of the (layer, head), over the top entries and a few random
    body entries of every (layer, KV head)."""
    worst = 0.0
    for f in range(parent.n_attn_layers):
        base = _ungated_rows(engine, f, parent, forced)
        for h in range(parent.n_kv_heads):
            s = scores[f][h].double()
            body = torch.arange(parent.prot, parent.n)
            top = body[torch.topk(s[parent.prot :], 2).indices]
            rand = body[torch.randperm(len(body), generator=gen)[:entries_per_head]]
            scale = s[parent.prot :].max().item()
            assert scale > 0
            for i in sorted(set(top.tolist()) | set(rand.tolist())):
                brute = deletion_utility(engine, parent, f, h, i, forced, base)
                worst = max(worst, abs(brute - s[i].item()) / scale)
    return worst


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_next_moe", "qwen3_5"])
def test_oracle_scores_equal_brute_force_deletion_on_random_models(family, one_thread):
    engine = TorchEngine(tiny_model(family))
    gen = torch.Generator().manual_seed(3)
    context = torch.randint(0, 384, (70,), generator=gen).tolist()
    question = QuestionInput(tuple(torch.randint(0, 384, (6,), generator=gen).tolist()), max_new_tokens=5)
    parent = engine.prefill(context, prot=4, query_window=1)
    try:
        oracle = Oracle()
        answer = oracle.full_cache_answer(parent, question)
        assert len(answer) == 5  # no tokenizer: no stop ids, the whole budget
        scores = oracle.score_question(parent, question)
        assert [tuple(s.shape) for s in scores] == [(parent.n_kv_heads, parent.n)] * parent.n_attn_layers
        forced = list(question.token_ids) + answer
        assert check_against_deletion(engine, parent, scores, forced, 3, gen) < 1e-4
    finally:
        parent.release()


def test_recompute_attention_by_hand_and_too_few_keys():
    """The last T rows over N keys, causally: N == T (a square block) is the plain causal softmax, worked by hand
    (one head, D = 1, scaling 1); fewer keys than rows is an error."""
    q = torch.tensor([[[1.0], [2.0]]])  # [H=1, T=2, D=1]
    k, v = torch.tensor([[[1.0], [0.0]]]), torch.tensor([[[3.0], [5.0]]])  # [H_kv=1, N=2, D=1]
    a, o = recompute_attention(q, k, v, 1.0, dtype=torch.float64)
    s = torch.sigmoid(torch.tensor(2.0, dtype=torch.float64)).item()  # row 1: logits (2, 0)
    torch.testing.assert_close(a, torch.tensor([[[[1.0, 0.0], [s, 1 - s]]]], dtype=torch.float64))
    torch.testing.assert_close(o, torch.tensor([[[[3.0], [3 * s + 5 * (1 - s)]]]], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^2 query rows but only 1 keys$"):
        recompute_attention(q, k[:, :1], v[:, :1], 1.0)


@pytest.fixture(scope="module")
def trained():
    lm = load_model("tiny-trained")
    return lm, TorchEngine(lm.model, lm.tokenizer, fingerprint=lm.fingerprint)


def needle_items(lm, limit: int):
    bench = get_bench("needle")
    return list(
        bench.contexts("niah_single_1", length=1024, limit=limit, seed=42, prompt_length=prompt_length(lm.tokenizer))
    )


def test_oracle_scores_equal_brute_force_deletion_on_the_trained_model(trained, one_thread):
    """Peaked retrieval attention (a -> 1, where a / (1 - a) is ill-conditioned) on a real niah item."""
    lm, engine = trained
    (ctx,) = needle_items(lm, 1)
    r = render(lm.tokenizer, ctx, max_length=engine.max_context)
    parent = engine.prefill(r.context_ids, r.prot, query_window=1)
    try:
        q = QuestionInput(tuple(r.question_ids[0]), ctx.questions[0].max_new_tokens)
        oracle = Oracle()
        forced = list(q.token_ids) + oracle.full_cache_answer(parent, q)
        scores = oracle.score_question(parent, q)
        assert check_against_deletion(engine, parent, scores, forced, 2, torch.Generator().manual_seed(0)) < 1e-3
    finally:
        parent.release()


def test_probe_values_are_the_values_a_prefill_caches(trained):
    """The hooked probe values of tokens fed after a context equal the values a prefill of the longer context
    caches at those positions (so ``o`` of the forced rows is the model's own)."""
    lm, engine = trained
    ids = lm.tokenizer("The grass is green. The sky is blue. One of the special magic numbers is 1234.")["input_ids"]
    head, tail = ids[:12], ids[12:]
    parent = engine.prefill(head, 2, query_window=1)
    longer = None
    try:
        probed = probe_with_values(parent, engine.adapter.attn, tail)
        parent.release()
        longer = engine.prefill(ids, 2, query_window=len(tail))
        for f, (q, k, v) in enumerate(probed):
            torch.testing.assert_close(v, longer.values(f)[:, 12:], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(k, longer.keys(f)[:, 12:], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(q, longer.queries(f, range(12, len(ids))), rtol=1e-4, atol=1e-5)
    finally:
        parent.release()
        if longer is not None:
            longer.release()


# ----------------------------------------------------------------------------------------------------
# The needle is kept
# ----------------------------------------------------------------------------------------------------


def needle_positions(lm, ctx, context_ids: list[int]) -> list[int]:
    (value,) = ctx.meta["values"][0]
    vids = lm.tokenizer(" " + value, add_special_tokens=False)["input_ids"]
    starts = [i for i in range(len(context_ids) - len(vids) + 1) if context_ids[i : i + len(vids)] == vids]
    assert len(starts) == 1, (value, starts)
    return list(range(starts[0], starts[0] + len(vids)))


def test_oracle_keeps_the_needle_on_niah_items(trained, one_thread):
    """At p = 0.1 (gate allocation) the needle's value tokens are all kept in some (layer, KV head), and the
    child answers as the full cache does; random eviction at the same budget keeps them in no head."""
    lm, engine = trained
    oracle, rnd = get_method("oracle"), get_method("random", seed=42)
    for ctx in needle_items(lm, 3):
        r = render(lm.tokenizer, ctx, max_length=engine.max_context)
        parent = engine.prefill(r.context_ids, r.prot, query_window=1)
        try:
            q = ctx.questions[0]
            needle = set(needle_positions(lm, ctx, r.context_ids))
            assert min(needle) >= parent.prot  # in the evictable body
            full = parent.answer(r.question_ids[0], max_new_tokens=q.max_new_tokens, context_sha256=parent.sha256)
            assert q.references[0] in full.text  # the model solves it at full cache
            scores = oracle.score_question(parent, QuestionInput(tuple(r.question_ids[0]), q.max_new_tokens))
            kept = oracle.select(parent, scores, 0.1, "gate")
            holds = [needle <= set(idx.tolist()) for heads in kept for idx in heads]
            assert any(holds), "the oracle dropped the needle in every (layer, head)"
            child = parent.fork(kept)
            try:
                ans = child.answer(r.question_ids[0], max_new_tokens=q.max_new_tokens, context_sha256=parent.sha256)
            finally:
                child.release()
            assert ans.token_ids == full.token_ids
            random_kept = rnd.select(parent, rnd.score(parent), 0.1, "gate")
            assert not any(needle <= set(idx.tolist()) for heads in random_kept for idx in heads)
        finally:
            parent.release()


# ----------------------------------------------------------------------------------------------------
# The subclassing path and the runner's per-question path
# ----------------------------------------------------------------------------------------------------


@register_method
class QuestionTokensForTest(QueryAwareMethod):
    """Keeps the context entries whose token occurs in the question (a query-aware method defined outside the
    package); records every call."""

    name = "test-question-tokens"
    default_allocation = "flat"
    calls: list[tuple[str, tuple[int, ...], int]] = []

    def score_question(self, parent, question):
        type(self).calls.append((parent.sha256, question.token_ids, question.max_new_tokens))
        asked = set(question.token_ids)
        hit = torch.tensor([float(t in asked) for t in parent.token_ids])
        # ties broken towards later positions, the same in every head
        s = hit + torch.arange(parent.n) / (10 * parent.n)
        return [s.expand(parent.n_kv_heads, -1).clone() for _ in range(parent.n_attn_layers)]


def test_query_aware_classes_are_checked():
    assert method_class("oracle").query_aware and method_class("test-question-tokens").query_aware
    assert not method_class("snapkv").query_aware and not method_class("full").query_aware
    assert method_class("oracle").default_allocation == "gate"

    class Pretender(EvictionMethod):
        name = "test-pretender"
        query_aware = True

        def score(self, parent):
            return []

    with pytest.raises(ValueError, match="QueryAwareMethod"):
        register_method(Pretender)
    with pytest.raises(KvbenchError, match="per question"):
        QuestionTokensForTest().score(None)
    with pytest.raises(KvbenchError, match="query-agnostic"):
        get_method("keydiff").score_question(None, QuestionInput((1,), 1))


def test_oracle_refuses_an_engine_without_the_model(tmp_path):
    """A parent that is not the torch engine's (vLLM) is an error naming --engine torch, before any decoding."""

    class Foreign:
        engine = object()

    class Engineless:  # a parent that names no engine at all
        pass

    message = (
        r"^oracle reads each attention layer's output projection from the model, which only the torch engine "
        r"exposes; run it with --engine torch$"
    )
    for parent in (Foreign(), Engineless()):
        with pytest.raises(KvbenchError, match=message):
            Oracle().score_question(parent, QuestionInput((1, 2), 4))
    config = RunConfig(methods=["full", "oracle"], bench="needle", ps=[0.5], out=tmp_path / "x", engine="vllm")
    with pytest.raises(KvbenchError, match="runs on the torch engine only"):
        validate(config)  # before any model loads


def read_rows(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_third_party_query_aware_method_runs_per_question(tmp_path, monkeypatch, one_thread):
    """SCBench multi-question contexts (fixtures): the method is scored once per question (not per p), sees
    each question's own token ids, and every row equals a by-hand fork of its question's kept set."""
    monkeypatch.setenv("KVBENCH_DATA_DIR", FIXTURES)
    QuestionTokensForTest.calls.clear()
    config = RunConfig(
        methods=["test-question-tokens", "full"], bench="scbench", tasks=["mf"], ps=[0.5, 0.1],
        out=tmp_path / "run", model="tiny-random", limit=2,
    )  # fmt: skip
    lm = load_model("tiny-random")
    summary = run(config, lm=lm)
    rows = read_rows(config.out)
    mine = [r for r in rows if r["method"] == "test-question-tokens"]
    contexts = list(get_bench("scbench").contexts("mf", length=None, limit=2, seed=42,
                                                  prompt_length=prompt_length(lm.tokenizer)))  # fmt: skip
    n_questions = sum(len(c.questions) for c in contexts)
    assert n_questions >= 2 * len(contexts) >= 2  # several questions per context: the path is exercised
    assert len(mine) == 2 * n_questions and summary.rows_written == len(rows) == 3 * n_questions
    assert all(r["query_aware"] for r in mine) and not any(r["query_aware"] for r in rows if r["method"] == "full")
    assert all(r["allocation"] == "flat" for r in mine)

    engine = TorchEngine(lm.model, lm.tokenizer, fingerprint=lm.fingerprint)
    expected_calls = []
    method = QuestionTokensForTest()
    by_key = {(r["item"], r["question"], r["p"]): r for r in mine}
    for ctx in contexts:
        rd = render(lm.tokenizer, ctx, max_length=engine.max_context)
        parent = engine.prefill(rd.context_ids, rd.prot, query_window=1)
        try:
            for qi, q in enumerate(ctx.questions):
                expected_calls.append((rd.sha256, tuple(rd.question_ids[qi]), q.max_new_tokens))
                scores = method.score_question(parent, QuestionInput(tuple(rd.question_ids[qi]), q.max_new_tokens))
                for p in (0.5, 0.1):
                    kept = method.select(parent, scores, p, "flat")
                    child = parent.fork(kept)
                    try:
                        ans = child.answer(
                            rd.question_ids[qi], max_new_tokens=q.max_new_tokens, context_sha256=rd.sha256
                        )
                    finally:
                        child.release()
                    row = by_key[(ctx.item, q.qid, p)]
                    assert row["prediction"] == ans.text
                    assert row["kept_entries"] == child.stats.kept_entries
        finally:
            parent.release()
    # the runner's calls (one per question, the first len(expected) calls) equal the by-hand ones
    assert QuestionTokensForTest.calls[: len(expected_calls)] == expected_calls
    assert len({c[1] for c in expected_calls}) > len(contexts)  # the questions differ within a context

    # rerun: every row is done, the method is not called again
    QuestionTokensForTest.calls.clear()
    again = run(config, lm=lm)
    assert again.rows_written == 0 and again.rows_skipped == len(rows) and QuestionTokensForTest.calls == []


def test_oracle_through_the_cli_beats_random_on_the_needle(tmp_path, capsys):
    """`kvbench run --method oracle,random` on the default model: query-aware rows, gate allocation, per-head
    budgets of the allocation, and the ceiling at least as high as random on every (item, p)."""
    from tests.test_cli import kvbench

    out = tmp_path / "run"
    code = kvbench("run", "--method", "oracle,random", "--bench", "needle", "--p", "0.5,0.1", "--limit", "2",
                   "--out", str(out))  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = read_rows(out)
    oracle = {(r["item"], r["p"]): r for r in rows if r["method"] == "oracle"}
    rnd = {(r["item"], r["p"]): r for r in rows if r["method"] == "random"}
    assert len(oracle) == len(rnd) == 4
    for key, r in oracle.items():
        assert r["query_aware"] is True and rnd[key]["query_aware"] is False and r["allocation"] == "gate"
        k = budgets.per_head_budget(r["n_context"], r["prot"], r["p"])
        assert r["kept_entries"] == 3 * 2 * (r["prot"] + k)  # 3 attention layers x 2 KV heads, gate keeps the total
        assert r["score"] == 100.0 and r["score"] >= rnd[key]["score"]
        assert r["score_s"] > 0 and r["stored_bytes"] < r["full_bytes"]


# ----------------------------------------------------------------------------------------------------
# --model lists
# ----------------------------------------------------------------------------------------------------


def test_model_list_runs_each_model_once_into_one_out(tmp_path, capsys, monkeypatch):
    from kvbench.run import loop as runner
    from tests.test_cli import kvbench

    loaded = []
    real = runner.load_model
    monkeypatch.setattr(runner, "load_model", lambda name, **kw: loaded.append(name) or real(name, **kw))
    events, real_make = [], runner.make_engine

    def make_engine(kind, lm, *args, **kw):  # records when each model's engine opens and closes
        engine = real_make(kind, lm, *args, **kw)
        events.append(("open", lm.name))
        close = engine.close
        engine.close = lambda: events.append(("close", lm.name)) or close()
        return engine

    monkeypatch.setattr(runner, "make_engine", make_engine)
    out = tmp_path / "run"
    args = ["run", "--model", "tiny-random,tiny-random-qwen3_5", "--method", "full,keydiff", "--p", "0.5",
            "--limit", "1", "--length", "900", "--out", str(out)]  # fmt: skip
    assert kvbench(*args) == 0, capsys.readouterr().err
    assert loaded == ["tiny-random", "tiny-random-qwen3_5"]
    # each model's engine is closed before the next one opens (vLLM keeps one distributed state per process)
    assert events == [("open", "tiny-random"), ("close", "tiny-random"),
                      ("open", "tiny-random-qwen3_5"), ("close", "tiny-random-qwen3_5")]  # fmt: skip
    rows = read_rows(out)
    assert sorted((r["model"], r["method"]) for r in rows) == [
        ("tiny-random", "full"), ("tiny-random", "keydiff"),
        ("tiny-random-qwen3_5", "full"), ("tiny-random-qwen3_5", "keydiff"),
    ]  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert [m["model"] for m in manifest["runs"]] == ["tiny-random", "tiny-random-qwen3_5"]
    assert manifest["runs"][0]["model_fingerprint"] != manifest["runs"][1]["model_fingerprint"]
    # rerun: both models resume, nothing is duplicated
    assert kvbench(*args) == 0
    assert read_rows(out) == rows
    assert "4 already present" in capsys.readouterr().err.replace("\n", " ")
    # the report compares the two models side by side (one method ranked: its rank agreement is n/a)
    assert kvbench("report", "--results", str(out), "--out", str(tmp_path / "rep")) == 0
    printed = capsys.readouterr().out.replace("\n", " ")
    assert "Across models" in printed and "rank agreement" in printed
    html = (tmp_path / "rep" / "index.html").read_text()
    assert "Across models (mean over 1 common task)" in html and "tiny-random-qwen3_5 p=0.5" in html


@pytest.mark.parametrize(
    "models, message",
    [
        (["tiny-random", "tiny-random"], "more than once"),
        (["tiny-random", "tiny-trainde"], "unknown model 'tiny-trainde'"),
    ],
)
def test_bad_model_list_fails_before_any_model_loads(tmp_path, monkeypatch, models, message):
    from kvbench.run import loop as runner

    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    config = RunConfig(methods=["full"], bench="needle", ps=[0.5], out=tmp_path / "x")
    with pytest.raises(KvbenchError, match=message):
        run_models(config, models)
    check_models(["tiny-random", "org/some-model", str(tmp_path)])  # built-in, hub id form, local directory
