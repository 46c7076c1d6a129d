"""scripts/probe_kv.py: key positions, the cached scoring against a plain forward, and the gate's exit code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "kvbench" / "builtin" / "tiny-trained"
sys.path.insert(0, str(ROOT / "scripts"))

import probe_kv as P  # noqa: E402


@pytest.fixture(scope="module")
def loaded():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="eager").eval()
    return tok, model


def test_scores_equal_a_plain_forward_and_key_spans_spell_the_keys(loaded):
    from kvbench.prompt import encode, render
    from kvbench.tasks.scbench import build_context
    from kvbench.tasks.scbench_generate import kv_row

    tok, model = loaded
    row = kv_row(42, 0, 5)
    items = list(json.loads(row["context"].removeprefix("JSON data:\n")).items())
    r = render(tok, build_context("kv", 0, row, {}, source="generated"))
    spans = P.key_spans(tok, r.context_ids, [k for k, _ in items])
    assert [tok.decode([r.context_ids[i] for i in s]) for s in spans] == [k for k, _ in items]
    values = [v for _, v in items]
    with torch.no_grad():
        ctx_out = P._forward(model, r.context_ids, None)
        scores, heads, _ = P.probe_question(model, tok, ctx_out, r.question_ids[0], values, 0, spans, 3, [3, 7, 11])
        for value, score in zip(values[:2], scores[:2], strict=False):
            v = encode(tok, value)[:3]
            ids = r.context_ids + r.question_ids[0] + v[:-1]
            logp = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
            n = len(r.context_ids) + len(r.question_ids[0]) - 1
            assert score == pytest.approx(float(sum(logp[n + i, t] for i, t in enumerate(v))), abs=1e-4)
    assert all(m.shape == (model.config.num_attention_heads, 5) for m in heads.values())
    assert all(float(m.sum(1).max()) <= 1 + 1e-5 for m in heads.values())


def test_main_writes_json_and_the_gate_exits_3(tmp_path, capsys):
    out = tmp_path / "probe.json"
    assert P.main([str(MODEL), "--pairs", "5", "--rows", "1", "--first", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["results"][0]
    assert result["pairs"] == 5 and result["questions"] == 5 and result["chance_top1"] == 0.2
    assert all(0 <= q["rank"] < 5 and q["p_right"] + q["p_others"] <= 1 + 1e-6 for q in result["per_question"])
    assert "top-1" in capsys.readouterr().out
    assert P.main([str(MODEL), "--pairs", "5", "--rows", "1", "--first", "1", "--require-top1", "1.01"]) == 3
    with pytest.raises(SystemExit):
        P.main([str(tmp_path), "--pairs", "5"])


def test_echo_and_say_modes_score_what_they_name(loaded, monkeypatch):
    """--echo feeds the asked pair's ``"KEY": "`` after the question and scores the values; --say scores each
    pair's whole quoted text (the quoted key's tokens plus ``first`` value tokens). Checked on the question ids
    and candidates that reach probe_question."""
    tok, model = loaded
    from kvbench.prompt import encode

    seen = []
    real = P.probe_question

    def spy(model_, tok_, ctx_out, question_ids, candidates, target, spans, first, attn_layers):
        seen.append((list(question_ids), list(candidates), target, first))
        return real(model_, tok_, ctx_out, question_ids, candidates, target, spans, first, attn_layers)

    monkeypatch.setattr(P, "probe_question", spy)
    plain = P.probe(model, tok, 5, 1, 42, 2)
    n = len(seen)
    echo = P.probe(model, tok, 5, 1, 42, 2, echo=True)
    say = P.probe(model, tok, 5, 1, 42, 2, say=True)
    assert plain["questions"] == echo["questions"] == say["questions"] == n == 5
    for (q0, c0, t0, f0), (q1, c1, t1, f1), (q2, c2, t2, f2) in zip(
        seen[:n], seen[n : 2 * n], seen[2 * n :], strict=True
    ):
        key = tok.decode(q1[len(q0) :])
        assert key.startswith('"') and key.endswith('": "') and c1 == c0 and f1 == f0 == 2 and t0 == t1 == t2
        assert q2 == q0 and c2[t2] == f"{key}{c0[t0]}" and f2 == len(encode(tok, key)) + 2
    with pytest.raises(SystemExit):
        P.main([str(MODEL), "--pairs", "5", "--echo", "--say"])
