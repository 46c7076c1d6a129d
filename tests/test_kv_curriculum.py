"""The key-matching curriculum's kv rows (``scbench_kv8`` / ``scbench_kv16`` / ``scbench_kv32``): SCBench kv
contexts with few pairs, in the evaluation's exact format, each asked key's value as the supervised answer."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest

import kvbench_training as T
from kvbench.errors import KvbenchError
from kvbench.prompt import encode, render
from kvbench.tasks.scbench import build_context
from kvbench.tasks.scbench_generate import KV_INPUT, TURNS, generate_row, kv_row

ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ROOT / "kvbench" / "builtin" / "tiny-trained")


def _pairs(context_text: str) -> dict[str, str]:
    body = context_text.split("JSON data:\n", 1)[1]
    return json.loads(body[: body.index("}") + 1])


@pytest.mark.parametrize("task,length", [("scbench_kv8", 1024), ("scbench_kv16", 1536), ("scbench_kv32", 3072)])
def test_a_curriculum_row_is_an_evaluation_kv_row_then_its_answered_questions(task, length):
    tok = tokenizer()
    eos = tok.eos_token_id
    lo, hi = T.KV_CURRICULUM[task]
    counts = set()
    for ex_seed in range(T.TRAIN_SEED_BASE, T.TRAIN_SEED_BASE + 6):
        ids, mask, refs = T.kv_curriculum_row(task, ex_seed, length, tok)
        assert len(ids) == len(mask) <= length
        # the context is the evaluation's rendering of the generator's own row with that many pairs
        text = tok.decode(ids)
        pairs = _pairs(text)
        counts.add(len(pairs))
        assert lo <= len(pairs) <= hi
        evaluated = render(tok, build_context("kv", 0, kv_row(ex_seed, 0, len(pairs), ask=[0]), {}, source="generated"))
        n_ctx = len(evaluated.context_ids)
        assert ids[:n_ctx] == evaluated.context_ids and not any(mask[:n_ctx])
        # then, per question: the evaluation's question ids, unsupervised, then the asked key's value and
        # <|im_end|>, supervised
        keys = {v: k for k, v in pairs.items()}
        pos = n_ctx
        assert 1 <= len(refs) <= min(TURNS, len(pairs) - 1) and len(set(refs)) == len(refs)
        for value in refs:
            answer = encode(tok, value) + [eos]
            turn = {"input": KV_INPUT.format(key=keys[value]), "answer": value}
            row = {"id": 0, "context": "JSON data:\n" + json.dumps(pairs), "multi_turns": [turn]}
            question_ids = render(tok, build_context("kv", 0, row, {}, source="generated")).question_ids[0]
            assert ids[pos : pos + len(question_ids)] == question_ids
            pos += len(question_ids)
            assert ids[pos : pos + len(answer)] == answer and all(mask[pos : pos + len(answer)])
            assert not any(mask[pos - len(question_ids) : pos])
            pos += len(answer)
        assert pos == len(ids)
    assert len(counts) > 1  # the pair count is drawn, not fixed


def test_curriculum_rows_are_drawn_from_their_seed_and_fall_back_when_too_short():
    tok = tokenizer()
    a = T.kv_curriculum_row("scbench_kv8", 12345, 1024, tok)
    assert a == T.kv_curriculum_row("scbench_kv8", 12345, 1024, tok)
    assert a != T.kv_curriculum_row("scbench_kv8", 12346, 1024, tok)
    assert T.kv_curriculum_row("scbench_kv32", 12345, 512, tok) is None
    ex = T.training_example(T.data.row_rng(0, 0, 0), 512, tok, (("scbench_kv32", 0.5), ("lookup", 0.5)))
    assert ex.task in ("lookup", "scbench_kv32")


def test_training_examples_of_a_kv_mix_answer_with_the_asked_value():
    tok = tokenizer()
    ex = T.training_example(T.data.row_rng(3, 1, 0), 1024, tok, (("scbench_kv8", 1.0),))
    assert ex.task == "scbench_kv8"
    supervised = tok.decode(ex.input_ids[ex.loss_mask.bool()].tolist())
    assert supervised == "".join(f"{v}<|im_end|>" for v in ex.references)
    assert "scbench_kv8" in T.KNOWN_TASKS and T.parse_mix("scbench_kv8=0.5,lookup=0.5")


def test_kv_row_extends_the_generator_and_asks_what_it_is_told():
    def n_pairs(row):
        return len(json.loads(row["context"].removeprefix("JSON data:\n")))

    for n in (5, 9, 51):
        assert kv_row(42, 3, n) == generate_row("kv", 3, length=n, seed=42, measure=n_pairs)
    row = kv_row(7, 0, 6, ask=[5, 0])
    items = list(json.loads(row["context"].removeprefix("JSON data:\n")).items())
    assert row["multi_turns"] == [
        {"answer": items[5][1], "input": KV_INPUT.format(key=items[5][0])},
        {"answer": items[0][1], "input": KV_INPUT.format(key=items[0][0])},
    ]
    assert n_pairs(kv_row(7, 0, 4, ask=[1])) == 4
    with pytest.raises(KvbenchError, match="at least 5"):
        kv_row(7, 0, 4)
    with pytest.raises(KvbenchError, match="within 0..5"):
        kv_row(7, 0, 6, ask=[6])


def test_echo_rows_repeat_the_pairs_own_text_before_the_supervised_value():
    tok = tokenizer()
    ids, mask, refs = T.kv_curriculum_row("scbench_kv8_echo", 10003, 1024, tok)
    assert len(ids) <= 1024 and refs
    text = tok.decode(ids)
    pairs = _pairs(text)
    keys = {v: k for k, v in pairs.items()}
    supervised = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert supervised == "".join(f"{v}<|im_end|>" for v in refs)
    for value in refs:  # each answer: the question, then '"KEY": "' (unsupervised), then the value
        assert f'Key: "{keys[value]}"' in text
        assert f'<|im_start|>assistant\n"{keys[value]}": "{value}<|im_end|>' in text
        assert f'"{keys[value]}": "{value}"' in text  # the same text in the context


def test_shorten_kv_keys_cuts_keys_everywhere_and_keeps_them_distinct():
    row = {
        "id": 0,
        "context": "JSON data:\n" + json.dumps({"abcd1234": "v1", "abce5678": "v2", "ffff0000": "v3"}),
        "multi_turns": [{"answer": "v2", "input": KV_INPUT.format(key="abce5678")}],
    }
    short = T.shorten_kv_keys(row, 2)  # "ab" would name two keys: every key keeps 4 characters ("abcd", "abce")
    assert json.loads(short["context"].removeprefix("JSON data:\n")) == {"abcd": "v1", "abce": "v2", "ffff": "v3"}
    assert short["multi_turns"] == [{"answer": "v2", "input": KV_INPUT.format(key="abce")}]
    assert T.shorten_kv_keys(row, 6)["multi_turns"][0]["input"] == KV_INPUT.format(key="abce56")
    assert row["multi_turns"][0]["input"] == KV_INPUT.format(key="abce5678")  # the input row is not changed


def test_short_key_rows_ask_short_keys_and_answer_full_values():
    tok = tokenizer()
    for task in ("scbench_kv8_short", "scbench_kv8_short_echo"):
        for ex_seed in range(T.TRAIN_SEED_BASE, T.TRAIN_SEED_BASE + 4):
            ids, mask, refs = T.kv_curriculum_row(task, ex_seed, 768, tok)
            text = tok.decode(ids)
            pairs = json.loads(text[text.index("{") : text.index("}") + 1])
            assert 4 <= len(pairs) <= 8 and all(4 <= len(k) <= 8 for k in pairs)
            assert len({len(k) for k in pairs}) == 1  # one key length per row
            full = json.loads(kv_row(ex_seed, 0, len(pairs))["context"].removeprefix("JSON data:\n"))
            assert list(pairs.values()) == list(full.values())  # the generator's own values, in order
            assert [k[: len(s)] for k, s in zip(full, pairs, strict=True)] == list(pairs)  # each key's prefix
            asked = [q.split('"')[1] for q in text.split("Key: ")[1:]]
            assert [pairs[k] for k in asked] == list(refs)
            supervised = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
            assert supervised == "".join(f"{v}<|im_end|>" for v in refs)


def test_say_rows_supervise_the_quoted_pair_which_the_kv_scorer_accepts():
    """``*_say`` rows: the answer is the asked pair's own text ``"KEY": "VALUE`` with every token of it supervised
    (echo rows leave ``"KEY": "`` unsupervised), and the official kv scorer gives that answer 100."""
    from kvbench.scorers import score

    tok = tokenizer()
    for task in ("scbench_kv8_say", "scbench_kv8_short_say"):
        for ex_seed in range(T.TRAIN_SEED_BASE, T.TRAIN_SEED_BASE + 3):
            ids, mask, refs = T.kv_curriculum_row(task, ex_seed, 1024, tok)
            text = tok.decode(ids)
            keys = {v: k for k, v in _pairs(text).items()}
            supervised = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
            assert supervised == "".join(f'"{keys[v]}": "{v}<|im_end|>' for v in refs)
            for value in refs:
                assert f'Key: "{keys[value]}"' in text and f'"{keys[value]}": "{value}"' in text
                assert score("scbench_kv", f'"{keys[value]}": "{value}', [value]) == 100.0


def test_full_context_say_rows_fill_the_evaluation_length():
    """``scbench_kv64_say``: a pair count drawn in 33-64, cut to what fits, so at the evaluation's 4,096 tokens
    the rows reach the generator's full context (as many pairs as fit) and never exceed the length."""
    tok = tokenizer()
    counts = []
    for ex_seed in range(T.TRAIN_SEED_BASE, T.TRAIN_SEED_BASE + 8):
        ids, mask, refs = T.kv_curriculum_row("scbench_kv64_say", ex_seed, 4096, tok)
        assert len(ids) == len(mask) <= 4096 and refs
        counts.append(len(_pairs(tok.decode(ids))))
    assert all(33 <= c <= 64 for c in counts)
    # counts above what fits are cut to it: the longest rows hold the full context's ~51 pairs (45 or more)
    assert max(counts) >= 45 and len(set(counts)) > 1
    assert T.kv_curriculum_row("scbench_kv64_say", T.TRAIN_SEED_BASE, 2048, tok) is None
