"""The built-in ``needle`` bench: RULER niah_single_1 through the RULER generator (sizing, placement,
determinism, the alias itself)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.errors import KvbenchError
from kvbench.scorers import get_scorer
from kvbench.tasks import Context, get_bench, list_benches

TASK = "niah_single_1"
GEN = 128
CONST = 7  # stands in for the chat template's tokens
# RULER's niah template with one value asked for (constants.py + niah.py's singular rewrite)
INSTRUCTION = (
    "A special magic number is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the number afterwards."
)
NEEDLE = "One of the special magic numbers for {key} is: {value}."
QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
ANSWER_PREFIX = "The special magic number for {key} mentioned in the provided text is"
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def words(ctx: Context) -> int:
    q = ctx.questions[0]
    return CONST + sum(len(s.split()) for s in (ctx.instruction, ctx.body, q.text, q.answer_prefix))


# Prompt without any noise line, in words: keys and values are one word each.
BARE = CONST + sum(len(s.format(key="k", value="v").split()) for s in (INSTRUCTION, NEEDLE, QUESTION, ANSWER_PREFIX))
NOISE_WORDS = len(NOISE.split())  # 19
MIN_LENGTH = BARE + NOISE_WORDS + GEN  # shortest --length that holds one noise line


def generate(length, limit=3, seed=0, prompt_length=words, bench="needle"):
    return list(get_bench(bench).contexts(TASK, length=length, limit=limit, seed=seed, prompt_length=prompt_length))


def one_more_line(ctx: Context) -> Context:
    return dataclasses.replace(ctx, body=ctx.body + "\n" + NOISE)


def check_context(ctx: Context, length: int, prompt_length) -> None:
    assert prompt_length(ctx) + GEN <= length
    (q,) = ctx.questions
    (key,), ((value,),) = ctx.meta["keys"], ctx.meta["values"]
    needle = NEEDLE.format(key=key, value=value)
    assert ctx.body.count(needle) == 1 and ctx.body.count("special magic") == 1
    assert q.references == (value,) and re.fullmatch(r"[1-9]\d{6}", value)
    assert ctx.body.count(value) == 1
    lines = ctx.body.split("\n")
    n = ctx.meta["n_haystack"]
    assert len(lines) == n + 1 and lines.count(NOISE) == n >= 1
    (depth,) = ctx.meta["depths"]
    assert depth == round(ctx.body.index(needle) / len(ctx.body), 4)
    assert ctx.instruction == INSTRUCTION
    assert q.text == QUESTION.format(key=key) and q.answer_prefix == ANSWER_PREFIX.format(key=key)
    assert q.max_new_tokens == GEN and q.scorers == ("string_match_all",)
    assert re.fullmatch(r"[^-]+(-[^-]+)*-[^-]+", key)  # RULER's adjective-noun key


def test_registered():
    bench = get_bench("needle")
    assert {"needle", "ruler"} <= set(list_benches())
    assert bench.name == "needle" and bench.description and "\n" not in bench.description
    assert bench.tasks() == [TASK]


def test_is_rulers_niah_single_1():
    a, b = generate(3000, limit=4), generate(3000, limit=4, bench="ruler")
    assert [c.bench for c in a] == ["needle"] * 4
    assert [dataclasses.replace(c, bench="ruler") for c in a] == b


@pytest.mark.parametrize("length", [MIN_LENGTH, MIN_LENGTH + 1, 1000, 4096])
def test_sized_to_length_with_exact_line_count(length):
    ctxs = generate(length, limit=4)
    assert [c.item for c in ctxs] == ["0", "1", "2", "3"]
    for ctx in ctxs:
        check_context(ctx, length, words)
        # every item costs the same words here, so each gets the probe's maximal haystack
        assert ctx.meta["n_haystack"] == (length - GEN - BARE) // NOISE_WORDS
        assert words(one_more_line(ctx)) + GEN > length


@settings(max_examples=60, deadline=None)
@given(length=st.integers(min_value=0, max_value=6000), seed=st.integers(0, 10**6))
def test_sizing_property(length, seed):
    if length < MIN_LENGTH:
        with pytest.raises(KvbenchError, match="too short"):
            generate(length, limit=2, seed=seed)
        return
    for ctx in generate(length, limit=2, seed=seed):
        check_context(ctx, length, words)


def test_too_short_message():
    with pytest.raises(KvbenchError) as err:
        generate(MIN_LENGTH - 1)
    msg = str(err.value)
    assert f"--length {MIN_LENGTH - 1} is too short for needle/{TASK}" in msg
    assert f"a prompt takes {MIN_LENGTH} tokens with the {GEN} to generate" in msg
    assert f"--length >= {MIN_LENGTH}" in msg


def test_deterministic_and_independent_of_limit():
    a, b = generate(2000, limit=10, seed=5), generate(2000, limit=10, seed=5)
    assert a == b
    assert generate(2000, limit=3, seed=5)[2] == a[2]
    other = generate(2000, limit=10, seed=6)
    assert [c.questions[0].references for c in other] != [c.questions[0].references for c in a]
    assert len({c.questions[0].references for c in a}) > 1  # items differ from each other
    assert len({c.meta["depths"][0] for c in a}) > 1


def test_limit_zero_and_unknown_task():
    assert generate(2000, limit=0) == []
    with pytest.raises(KvbenchError, match=TASK):  # raised by the call itself, before iterating
        get_bench("needle").contexts("niah_multikey_1", length=2000, limit=1, seed=0, prompt_length=words)


def test_search_is_cheap_after_the_first_item():
    calls = []

    def counting(ctx: Context) -> int:
        calls.append(ctx.item)
        return words(ctx)

    gen = get_bench("needle").contexts(TASK, length=50_000, limit=10, seed=0, prompt_length=counting)
    next(gen)
    assert len(calls) <= 2 * (50_000).bit_length() + 4  # estimate, gallop, bisect: O(log length)
    calls.clear()
    rest = list(gen)
    assert len(rest) == 9 and len(calls) == 9  # the probe's size fits every later item at once


def test_terminates_when_prompt_length_ignores_the_haystack():
    (ctx,) = generate(300, limit=1, prompt_length=lambda ctx: 10)
    # RULER's search stops at its upper bound, 3 x its estimate from one sample of the increment (5 noise
    # lines below 4,096 tokens) measured at 10 tokens: int(300 / (10 / 5) * 3) = 450
    assert ctx.meta["n_haystack"] == 450


def test_references_score_with_declared_scorer():
    for ctx in generate(1500, limit=3):
        q = ctx.questions[0]
        scorer = get_scorer(q.scorers[0])
        assert scorer(f"{q.answer_prefix} {q.references[0]}.", q.references) == 100.0
        assert scorer("I don't know.", q.references) == 0.0


@pytest.mark.parametrize("length", [2000, 4096])
def test_with_real_byte_level_tokenizer(length):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)

    def prompt_length(ctx: Context) -> int:
        q = ctx.questions[0]
        text = f"<|user|>\n{ctx.instruction}\n{ctx.body}\n{q.text}<|end|>\n<|assistant|>\n{q.answer_prefix}"
        return len(tok.encode(text).ids)

    step = 25 if length >= 4096 else 5  # RULER's per-sample decrement for line haystacks
    ctxs = generate(length, limit=8, seed=1, prompt_length=prompt_length)
    probe = ctxs[0].meta["n_haystack"]
    assert prompt_length(one_more_line(ctxs[0])) + GEN > length  # the binary search's size is maximal
    for ctx in ctxs:
        check_context(ctx, length, prompt_length)
        n = ctx.meta["n_haystack"]
        assert n <= probe and (probe - n) % step == 0
        if n < probe:  # stepped down only because the larger size did not fit
            bigger = dataclasses.replace(ctx, body=ctx.body + ("\n" + NOISE) * step)
            assert prompt_length(bigger) + GEN > length
