"""SCBench's shared-context assembly against microsoft/MInference's own code, token for token.

The fixtures in ``tests/fixtures/scbench_official/`` were written by ``scripts/scbench_official_fixtures.py``,
which runs the official ``eval_utils.create_scdq_prompt`` (``use_chat_template=True``) and
``run_scbench.truncate_by_tokens`` with ``run_scbench.py``'s scdq ``max_input_length``, with the shipped
``tiny-trained`` tokenizer (commands and MInference commit in the README there). kvbench builds the same rows
with :func:`kvbench.tasks.scbench.build_context` and renders them with :func:`kvbench.prompt.render` at the
same ``max_seq_length``: the context ids and every query's ids must be the official ones, and every question's
``max_new_tokens`` the official budget of its turn. The MInference checkout is not needed here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kvbench import models
from kvbench.prompt import encode, render, template_parts
from kvbench.tasks import scbench as sb

FIXTURES = Path(__file__).parent / "fixtures"
OFFICIAL = FIXTURES / "scbench_official"
MODEL_LIMIT = 131_072  # the official scripts' --max_seq_length


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(models.BUILTIN_MODELS["tiny-trained"].shipped))


def official_cases(task: str) -> list[dict]:
    doc = json.loads((OFFICIAL / f"{task}.json").read_text(encoding="utf-8"))
    assert doc["task"] == task and doc["tokenizer"] == "kvbench/builtin/tiny-trained" and doc["minference_commit"]
    return doc["cases"]


def rows_of(rel: str) -> list[dict]:
    """The rows the official code was given: a committed hub-layout parquet or an inputs/ JSON list."""
    path = FIXTURES / rel
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    return json.loads(path.read_text(encoding="utf-8"))


def kvbench_case(task: str, case: dict, tokenizer):
    """(context, rendered) of the official case's row, as kvbench builds and renders it."""
    rows = rows_of(case["rows"])
    needles = sb.needle_pool(task, rows) if task in ("repoqa", "repoqa_and_kv") else None
    ctx = sb.build_context(task, case["index"], rows[case["index"]], needles, max_turns=None)
    return ctx, render(tokenizer, ctx, max_length=case["max_seq_length"])


def _where(task: str, case: dict) -> str:
    return f"{task}: {case['rows']}[{case['index']}] at max_seq_length {case['max_seq_length']} ({case['why']})"


@pytest.mark.parametrize("task", sb.TASKS)
def test_kvbench_gives_the_official_ids(task, tokenizer):
    cases = official_cases(task)
    fixture = f"scbench/scbench_{task}/test-00000-of-00001.parquet"
    # every committed fixture row is there, at the model limit
    at_limit = {c["index"] for c in cases if c["rows"] == fixture and c["max_seq_length"] == MODEL_LIMIT}
    assert at_limit == set(range(len(rows_of(fixture))))
    for case in cases:
        where = _where(task, case)
        ctx, r = kvbench_case(task, case, tokenizer)
        # the official max_input_length is max_seq_length - kvbench's reserve (new tokens * T (+ 1000))
        assert ctx.reserve_tokens == case["max_seq_length"] - case["max_input_length"], where
        assert r.context_ids == case["context_ids"], where
        assert len(r.question_ids) == len(ctx.questions) == len(case["query_ids"]) == case["n_turns"], where
        for j, ids in enumerate(case["query_ids"]):
            assert r.question_ids[j] == ids, f"{where}, query {j}"
        assert [q.max_new_tokens for q in ctx.questions] == case["max_new_tokens"], where
        if case["truncated"]:
            assert r.truncated_from == case["tokens_before"] > len(r.context_ids), where
        else:
            assert r.truncated_from is None and len(r.context_ids) == case["tokens_before"], where
        assert r.prefix_ids == r.context_ids[: len(r.prefix_ids)] and r.body_ids, where


def test_truncated_rows_are_cut_plain_and_mixed(tokenizer):
    """The fixtures exercise the middle cut on a plain task (6 turns: the reserve counts the official 5) and a
    mixed one (3 turns: ``sum * T // 2``), each with an odd ``L`` (``L - 1`` ids kept), and a limit so small
    that the cut goes through the instruction."""
    cut = {(t, c["n_turns"], c["max_input_length"]): c for t in sb.TASKS for c in official_cases(t) if c["truncated"]}
    kv = cut[("kv", 6, 401)]
    swn = cut[("summary_with_needles", 3, 301)]
    assert kv["turns_for_reserve"] == 5 and kv["max_seq_length"] - kv["max_input_length"] == 150 * 5 + 1000
    assert swn["max_seq_length"] - swn["max_input_length"] == (800 + 15) * 3 // 2 + 1000
    assert len(kv["context_ids"]) == 400 and len(swn["context_ids"]) == 300
    repoqa = next(c for (t, _, _), c in cut.items() if t == "repoqa")
    ctx, r = kvbench_case("repoqa", repoqa, tokenizer)
    head, _ = template_parts(tokenizer)
    assert len(encode(tokenizer, head + ctx.instruction)) > len(r.context_ids) // 2 == len(r.prefix_ids)
    for task, case in (("kv", kv), ("summary_with_needles", swn)):
        _, r = kvbench_case(task, case, tokenizer)
        assert r.truncated_from == case["tokens_before"] > case["max_input_length"]


def test_whitespace_led_bodies_are_encoded_in_one_piece(tokenizer):
    """Bodies led by spaces: the official ids (template head, instruction and body encoded in one call) are not
    what encoding the head and the body separately gives, so these fixtures catch a two-piece encoding."""
    seen = []
    for task in sb.TASKS:
        for case in official_cases(task):
            ctx, r = kvbench_case(task, case, tokenizer)
            if not ctx.body[:1].isspace():
                continue
            seen.append(task)
            head, _ = template_parts(tokenizer)
            two_pieces = encode(tokenizer, head + ctx.instruction) + encode(tokenizer, ctx.body)
            assert two_pieces != case["context_ids"] == r.context_ids, _where(task, case)
    assert {"choice_eng", "vt"} <= set(seen)  # one with an instruction, one without
