"""scripts/diagnose_kv_kept.py: the asked pair's token positions and the kept shares, against hand-worked cases."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import diagnose_kv_kept as D  # noqa: E402


def test_pair_spans_spell_the_asked_key_and_value():
    from transformers import AutoTokenizer

    from kvbench.prompt import render
    from kvbench.tasks.scbench import build_context
    from kvbench.tasks.scbench_generate import kv_row

    tok = AutoTokenizer.from_pretrained(ROOT / "kvbench" / "builtin" / "tiny-trained")
    row = kv_row(42, 0, 6)
    pairs = dict(json.loads(row["context"].removeprefix("JSON data:\n")))
    ctx = build_context("kv", 0, row, {}, source="generated")
    r = render(tok, ctx)
    spans = D.pair_spans(tok, r.context_ids, ctx.questions)
    assert len(spans) == len(ctx.questions) == 5
    for q, (key_pos, value_pos) in zip(ctx.questions, spans, strict=True):
        key = tok.decode([r.context_ids[i] for i in key_pos])
        value = tok.decode([r.context_ids[i] for i in value_pos])
        assert value == q.references[0] and pairs[key] == value  # the asked pair, the key read from the context
        assert key_pos == list(range(key_pos[0], key_pos[-1] + 1)) and key_pos[-1] < value_pos[0]


def test_kept_shares_by_hand():
    t = torch.tensor
    # two layers x one KV head; pair: key tokens 2-3, value tokens 5-7
    kept = [[t([0, 1, 2, 3, 5, 6, 7])], [t([0, 1, 3, 6])]]
    key, value, whole = D.kept_shares(kept, [([2, 3], [5, 6, 7])])
    assert key == pytest.approx((1 + 0.5) / 2)
    assert value == pytest.approx((1 + 1 / 3) / 2)
    assert whole == pytest.approx(0.5)  # the first layer's head keeps the whole pair, the second's does not
    # two questions: the second pair is nowhere
    key, value, whole = D.kept_shares(kept, [([2, 3], [5, 6, 7]), ([8], [9])])
    assert (key, whole) == (pytest.approx(0.75 / 2), pytest.approx(0.25))


def test_method_entries_carry_options():
    assert D.parse_method("gatesight[calibration=generic]:gate") == ("gatesight", {"calibration": "generic"}, "gate")
    assert D.parse_method("snapkv:flat") == ("snapkv", {}, "flat")
    assert D.parse_method("triattention[trig=false,mlr=true]:flat") == (
        "triattention",
        {"trig": "false", "mlr": "true"},
        "flat",
    )
