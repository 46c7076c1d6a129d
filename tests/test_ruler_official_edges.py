"""Edges of RULER's ``official`` sampling and its fixed ingredients that the fixture comparison does not reach.

The byte-identical fixture runs (``tests/test_ruler_official.py``) cover the generators end to end; these
checks pin the pieces they cannot: objects built at import time (templates, niah configs) rebuilt by hand,
the token measure's fallback path, cwe's ``english_words.json`` fallback, the niah key order for adjectives
outside wonderwords, and SQuAD parsing of files RULER's fixtures do not contain. Expected values are
hand-worked or brute force.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import string
from collections.abc import Callable
from pathlib import Path

import pytest

from kvbench.errors import KvbenchError
from kvbench.tasks import Context, ruler_official
from kvbench.tasks.ruler_data import (
    NIAH,
    NOISE,
    FormatError,
    NiahConfig,
    NiahKeys,
    _Template,
    parse_squad,
    singularize,
)
from kvbench.tasks.ruler_official import _CweWords, text_tokens
from kvbench.tasks.ruler_tasks import make_task

from .test_ruler import words

FIXTURES = Path(__file__).parent / "fixtures" / "ruler_official"

# ---------------------------------------------------------------------------------------------------
# ruler_data: templates and niah configs (the module's constants are built at import time)


def test_template_pieces_and_rulers_full_template():
    """A hand-made template: RULER's full template is instruction + glue + {context} + question glue +
    question + space + answer prefix; kvbench stores the glue minus one leading newline on each side."""
    t = _Template("INST", "\n\n", "ASK {query}", "\n ", "PREFIX")
    assert (t.instruction, t.glue, t.question, t.question_glue, t.answer_prefix) == (
        "INST", "\n\n", "ASK {query}", "\n ", "PREFIX")  # fmt: skip
    assert t.full() == "INST\n\n{context}\n ASK {query} PREFIX"
    assert t.instruction_text() == "INST\n"
    assert t.question_text() == " ASK {query}"
    fwe_like = _Template("I", " ", "Q", "\n", "A")
    assert fwe_like.full() == "I {context}\nQ A"
    assert fwe_like.instruction_text() == "I"  # the space travels as the context's glue


def test_niah_config_defaults_and_key_count():
    """synthetic.yaml's defaults are one key, one value, one query; niah.py needs max(k, q) keys."""
    c = NiahConfig("essay", "words", "numbers")
    assert (c.haystack, c.type_k, c.type_v) == ("essay", "words", "numbers")
    assert (c.num_k, c.num_v, c.num_q, c.singular) == (1, 1, 1, True)
    assert (NiahConfig("needle", "uuids", "uuids", k=4).num_k, NiahConfig("n", "w", "n", k=4).num_q) == (4, 1)
    mq = NiahConfig("essay", "words", "numbers", q=4)
    assert (mq.num_k, mq.num_v, mq.num_q, mq.singular) == (4, 1, 4, False)
    mv = NiahConfig("essay", "words", "numbers", v=4)
    assert (mv.num_k, mv.num_v, mv.num_q, mv.singular) == (1, 4, 1, False)
    assert NiahConfig("essay", "words", "numbers", k=3, q=2).num_k == 3


def test_singularize_is_rulers_chain_of_replacements():
    """niah.py: ``.replace('Some', 'A').replace('are all', 'is').replace('are', 'is').replace('answers',
    'answer')``, in that order (so "are all" becomes "is", not "is all"), on any template text."""
    assert singularize("Some answers are all here; others are not. Some.") == "A answer is here; others is not. A."
    assert singularize(NIAH.full()) == (
        "A special magic {type_v} is hidden within the following text. Make sure to memorize it. I will quiz you "
        "about the {type_v} afterwards.\n{context}\nWhat is the special magic {type_v} for {query} mentioned in "
        "the provided text? The special magic {type_v} for {query} mentioned in the provided text is"
    )


# ---------------------------------------------------------------------------------------------------
# ruler_data: niah keys


@pytest.mark.parametrize(
    "adjs",
    [
        ["a", "a0"],  # "a-" < "a0-": '-' sorts before digits (and before upper case)
        ["ab", "abC", "ab-c", "ab.x", "ab/", "a", "b"],
        ["x", "x-y", "x-y-z", "xA", "x9", "x y"],
    ],
)
def test_niah_keys_brute_force_on_punctuated_adjectives(adjs):
    """RULER's list is ``sorted(set(f"{adj}-{noun}"))``: brute force on adjectives whose roots differ only
    after a character that sorts between '-' and the letters."""
    nouns = ["n", "m-k", "Zed", "0"]
    keys = NiahKeys(adjs, nouns)
    brute = sorted({f"{a}-{n}" for a in adjs for n in nouns})
    assert [keys[i] for i in range(len(keys))] == brute
    assert len(keys) == len(brute)


# ---------------------------------------------------------------------------------------------------
# ruler_data: SQuAD parsing


def _squad(*paragraphs):
    return {"data": [{"paragraphs": [{"context": c, "qas": list(qas)} for c, qas in paragraphs]}]}


def test_squad_question_without_is_impossible_is_answerable():
    """A question without the ``is_impossible`` field (SQuAD v1 style) counts as answerable."""
    data = _squad(("doc", [{"question": "q?", "answers": [{"text": "a"}]}]))
    qas, docs = parse_squad(data)
    assert docs == ["doc"]
    assert qas == [{"query": "q?", "outputs": ["a"], "context": [0], "more_context": []}]


def test_squad_skips_only_the_unanswerable_question():
    """An unanswerable question drops itself, not the questions after it in the same paragraph."""
    data = _squad(
        ("B doc", [
            {"question": "no?", "answers": [], "is_impossible": True},
            {"question": "yes?", "answers": [{"text": "y"}, {"text": "Y"}], "is_impossible": False},
        ]),
        ("A doc", [{"question": "other?", "answers": [{"text": "o"}], "is_impossible": False}]),
    )  # fmt: skip
    qas, docs = parse_squad(data)
    assert docs == ["A doc", "B doc"]
    assert qas == [
        {"query": "yes?", "outputs": ["y", "Y"], "context": [1], "more_context": [0]},
        {"query": "other?", "outputs": ["o"], "context": [0], "more_context": [1]},
    ]


def test_squad_format_error_names_the_field():
    with pytest.raises(FormatError, match=r"^not a SQuAD v2 json \(missing or malformed field 'data'\)$"):
        parse_squad({"version": "v2.0"})


# ---------------------------------------------------------------------------------------------------
# ruler_official: raw-text token counts


def _probe_measure(ctx: Context) -> int:
    """A PromptLength: one token per body character plus a fixed 11 for the rest of the prompt."""
    return len(ctx.body) + 11


def test_text_tokens_probe_fallback_counts_the_text_alone():
    count = text_tokens(_probe_measure)
    assert [count(""), count("abc"), count("x" * 40)] == [0, 3, 40]


def test_text_tokens_prefers_the_measures_own_counter():
    """A measure with ``text_tokens`` (``kvbench.prompt.prompt_length``) is asked directly, not probed."""

    class Measure:
        def __call__(self, ctx: Context) -> int:
            return _probe_measure(ctx)

        @staticmethod
        def text_tokens(text: str) -> int:
            return len(text.split())  # words, not characters: the probe would give another number

    count = text_tokens(Measure())
    assert [count("two words"), count("a b c d")] == [2, 4]


# ---------------------------------------------------------------------------------------------------
# ruler_official: cwe's english_words.json fallback


FALLBACK = {f"k{i}": f"word{i}é" for i in range(30)}


def test_cwe_words_within_wonderwords_do_not_need_the_fallback(monkeypatch):
    monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
    words = _CweWords(["a", "b", "c"])
    assert sorted(words.sample(random.Random(1), 3)) == ["a", "b", "c"]


def test_cwe_words_beyond_wonderwords_come_from_english_words(tmp_path, monkeypatch):
    """RULER draws ``random.sample(english_words, k)`` from the json's values once k exceeds wonderwords; the
    file is read once."""
    (tmp_path / "ruler").mkdir()
    path = tmp_path / "ruler" / "english_words.json"
    path.write_text(json.dumps(FALLBACK, ensure_ascii=False), encoding="utf-8")
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path))
    words = _CweWords(["a", "b", "c"])
    got = words.sample(random.Random(5), 7)
    assert got == random.Random(5).sample([f"word{i}é" for i in range(30)], 7)
    path.unlink()  # loaded once: a second draw does not read it again
    assert words.sample(random.Random(6), 30) == random.Random(6).sample([f"word{i}é" for i in range(30)], 30)


@pytest.mark.parametrize("where", ["unset", "no file", "wrong case"])
def test_cwe_words_beyond_wonderwords_without_the_file(where, tmp_path, monkeypatch):
    if where == "unset":
        monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
    else:
        monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path))
        if where == "wrong case":
            (tmp_path / "RULER").mkdir()
            (tmp_path / "RULER" / "english_words.json").write_text(json.dumps(FALLBACK), encoding="utf-8")
            (tmp_path / "ruler").mkdir()
            (tmp_path / "ruler" / "ENGLISH_WORDS.JSON").write_text(json.dumps(FALLBACK), encoding="utf-8")
    words = _CweWords(["a", "b"])
    with pytest.raises(
        KvbenchError,
        match=r"^RULER's cwe draws 3 words here, more than wonderwords' 2: put RULER's english_words\.json \(git "
        r"lfs\) at \$KVBENCH_DATA_DIR/ruler/english_words\.json, or use a shorter --length$",
    ):
        words.sample(random.Random(0), 3)


# ---------------------------------------------------------------------------------------------------
# ruler_official: vt's variable names and RULER's crash on a repeated name


class _ScriptedRand:
    """Stands in for the task's ``random.Random``: ``choices`` returns the scripted names in turn (and checks
    it is asked for ``size`` upper-case letters, as RULER's ``generate_chains``)."""

    def __init__(self, names, size):
        self.names, self.size, self.calls = list(names), size, 0

    def choices(self, population, k):
        assert population == string.ascii_uppercase and k == self.size
        self.calls += 1
        return list(self.names.pop(0))


class _FakeRun:
    def __init__(self, rand):
        self.rand = rand


@pytest.mark.parametrize(
    "drawn, names",
    [
        (["ABC", "DEF", "GHI", "JKL", "MNO", "PQR"], ["ABC", "DEF", "GHI", "JKL", "MNO"]),
        # generate_chains redraws while fewer than 5 distinct names, keeping the repeats (then RULER fails)
        (["ABC", "DEF", "ABC", "JKL", "MNO", "PQR", "STU"], ["ABC", "DEF", "ABC", "JKL", "MNO", "PQR"]),
        (["ABC", "ABC", "ABC", "JKL", "MNO", "PQR", "STU", "VWX"], ["ABC", "ABC", "ABC", "JKL", "MNO", "PQR", "STU"]),
    ],
)
def test_vt_names_redraw_while_repeated(drawn, names):
    rand = _ScriptedRand(drawn, 3)
    assert ruler_official._vt_names(_FakeRun(rand), 3) == names
    assert rand.calls == len(names)


def _vt_run(monkeypatch, seed, count, crash=None, length=1024, measure=words, randint=None):
    """vt items and the number of ``_vt_names`` calls per name size (3: the example, 5: the items);
    ``crash=(size, k)`` makes the k-th call for that size return one extra name, as RULER's draw of a
    repeated name does; ``randint`` (a list) collects the arguments of every numpy ``randint`` call."""
    real, calls = ruler_official._vt_names, {3: 0, 5: 0}
    if randint is not None:
        import numpy as np

        class Spy(np.random.RandomState):
            def randint(self, *args, **kwargs):
                randint.append((args, tuple(kwargs)))
                return super().randint(*args, **kwargs)

        monkeypatch.setattr(np.random, "RandomState", Spy)

    def names(run, size):
        got = real(run, size)
        calls[size] += 1
        return got + ["ZZZZZ"[:size]] if crash == (size, calls[size]) else got

    monkeypatch.setattr(ruler_official, "_vt_names", names)
    try:
        items = list(ruler_official.official_items(make_task("ruler", "vt", seed, length), count, measure))
    finally:
        monkeypatch.undo()
    return items, calls


def _icl_value(ctx: Context) -> str:
    return re.search(r"assigned the value (\d{5}) in the text above", ctx.instruction).group(1)


def _icl_lines(ctx: Context) -> int:
    return ctx.instruction.count(NOISE)


def test_vt_item_draw_with_a_repeated_name_is_redrawn_one_step_smaller(monkeypatch):
    """RULER's item loop catches generate_chains' IndexError and retries ``incremental`` lines smaller; the
    failed draw used numpy twice (the chain's value, then the value of the second chain started from the
    extra name), so from the failing item on each item carries the values of the next item of a run
    without the failure (two numpy draws per item: the chain's value and the example's)."""
    plain, calls = _vt_run(monkeypatch, 3, 5)
    sizing = calls[5] - 5  # the size search's draws come before item 0's
    draws = []
    crashed, _ = _vt_run(monkeypatch, 3, 4, crash=(5, sizing + 2), randint=draws)  # item 1's first draw
    assert set(draws) == {((10000, 99999), ())}  # RULER: np.random.randint(10000, 99999), the extra chain's too
    assert len(draws) == sizing + 2 * 4 + 2  # one per size-search draw, two per item and per failed draw
    assert len({c.meta["n_haystack"] for c in plain}) == 1  # every item fits at the searched size
    n = plain[0].meta["n_haystack"]
    assert [c.meta["n_haystack"] for c in crashed] == [n, n - 5, n, n]  # 1,024 tokens: steps of 5 lines
    assert crashed[0].meta["value"] == plain[0].meta["value"]
    assert [c.meta["value"] for c in crashed[1:]] == [c.meta["value"] for c in plain[2:]]
    assert [_icl_value(c) for c in crashed[1:]] == [_icl_value(c) for c in plain[2:]]
    assert all(len(c.meta["chain"]) == 5 for c in crashed)
    assert all(c.meta["ruler_identical"] for c in crashed)


def test_vt_repeated_name_while_sizing_is_a_clear_error(monkeypatch):
    """RULER's size search has no retry: its script dies there, and kvbench says so."""
    for crash in [(3, 1), (5, 1)]:  # the example's first draw; the items' first draw
        with pytest.raises(
            KvbenchError,
            match=r"^RULER's own vt script fails at --length 1024 --seed 3 \(it draws a repeated variable name "
            r"while sizing\); use another --seed$",
        ):
            _vt_run(monkeypatch, 3, 1, crash=crash)


class _Words:
    """The word-count PromptLength, whose raw-text count adds ``extra`` tokens to the words."""

    def __init__(self, extra):
        self.extra = extra

    def __call__(self, ctx: Context) -> int:
        return words(ctx)

    def text_tokens(self, text: str) -> int:
        return len(text.split()) + self.extra


#: Words of vt's one-shot example around its noise lines: 48 of the template (query 12345, 5 variables) and
#: 24 of the chain ("VAR A = 12345", then four "VAR B = VAR A"); each noise line has 19.
VT_EXAMPLE_WORDS, NOISE_WORDS = 48 + 24, 19


@pytest.mark.parametrize("extra", [0, 10, 11, 29])
def test_vt_example_is_the_largest_within_500_raw_tokens(extra, monkeypatch):
    """RULER sizes the example at max_seq_length 500 (nothing generated): the most noise lines whose raw
    text is at most 500 tokens (``extra`` 10 makes 22 lines exactly 500)."""
    assert NOISE.count(" ") + 1 == NOISE_WORDS
    want = (500 - VT_EXAMPLE_WORDS - extra) // NOISE_WORDS
    items, calls = _vt_run(monkeypatch, 3, 2, length=4096, measure=_Words(extra))
    assert [_icl_lines(c) for c in items] == [want, want]
    assert all(c.meta["ruler_identical"] for c in items)
    # RULER's draws for the example: one of 5 lines for the estimate, one per step of its binary search over
    # [5, max(estimate, 10)], one more at the size found (it fits)
    lo, hi = 5, max(int(500 / ((VT_EXAMPLE_WORDS + 5 * NOISE_WORDS + extra) / 5) * 3), 10)
    steps = 0
    while lo <= hi:
        mid, steps = (lo + hi) // 2, steps + 1
        lo, hi = (mid + 1, hi) if mid <= want else (lo, mid - 1)
    assert calls[3] == 1 + steps + 1


def test_vt_example_draw_with_a_repeated_name_steps_down_five_lines(monkeypatch):
    """RULER's retry loop for the example catches the failed draw and retries 5 lines smaller."""
    _, calls = _vt_run(monkeypatch, 3, 1, length=4096)
    items, _ = _vt_run(monkeypatch, 3, 2, crash=(3, calls[3]), length=4096)  # the loop's first draw
    want = (500 - VT_EXAMPLE_WORDS) // NOISE_WORDS - 5
    assert [_icl_lines(c) for c in items] == [want, want]
    assert all(c.meta["ruler_identical"] for c in items)


class _ExampleNeverFits(_Words):
    """Raw text with the vt instruction in it counts 10**4 tokens: the example never fits 500."""

    def text_tokens(self, text: str) -> int:
        return 10**4 if "Memorize and track" in text else len(text.split())


def test_vt_example_that_never_fits_keeps_five_lines_after_the_redraws(monkeypatch):
    """One draw for the estimate (0 lines: 10**4 tokens per 5 lines), a search over [5, 10] that fails twice
    (7, then 5 lines), then RULER's endless loop cut at FLOOR_REDRAWS draws at 5 lines; the items are
    marked as not RULER's."""
    items, calls = _vt_run(monkeypatch, 3, 2, length=4096, measure=_ExampleNeverFits(0))
    assert calls[3] == 1 + 2 + ruler_official.FLOOR_REDRAWS == 67
    assert [_icl_lines(c) for c in items] == [5, 5]
    assert [c.meta["ruler_identical"] for c in items] == [False, False]


# ---------------------------------------------------------------------------------------------------
# ruler_official: RULER's size search, per-item step-down and kvbench's exit from RULER's endless loop


class _CountingNeverAtFive:
    """A PromptLength that records the haystack size of every prompt it measures: one token per word, but
    10**6 once the haystack reaches 5 lines (as tests/test_ruler_official.py's endless-loop case)."""

    def __init__(self):
        self.sizes = []

    def __call__(self, ctx: Context) -> int:
        self.sizes.append(ctx.meta["n_haystack"])
        return 10**6 if ctx.meta["n_haystack"] >= 5 else words(ctx)


def test_niah_draws_follow_rulers_search_and_retry_loop():
    """niah_single_1 at 1,024 tokens (increment 5 lines, floor 1 line), hand-worked draw by draw: the
    estimate draws 5 lines (10**6 tokens, so the estimate is 0); the search over [5, max(0, 10)] draws 7,
    then 5 lines and finds nothing, so items start at 5 lines; each item redraws at 5 lines FLOOR_REDRAWS
    times, then bisects [1, 4] (2, 3, 4 lines fit) and keeps 4 lines."""
    measure = _CountingNeverAtFive()
    items = list(ruler_official.official_items(make_task("ruler", "niah_single_1", 0, 1024), 2, measure))
    per_item = [5] * ruler_official.FLOOR_REDRAWS + [2, 3, 4]
    assert ruler_official.FLOOR_REDRAWS == 64
    assert measure.sizes == [5, 7, 5] + per_item + per_item
    assert [c.meta["n_haystack"] for c in items] == [4, 4]
    assert [c.meta["ruler_identical"] for c in items] == [False, False]
    assert [c.meta["prompt_tokens"] for c in items] == [words(c) for c in items]
    assert all(c.meta["sampling"] == "official" for c in items)


class _Fixed:
    """A PromptLength that measures every prompt as ``tokens`` tokens."""

    def __init__(self, tokens):
        self.tokens = tokens

    def __call__(self, ctx: Context) -> int:
        return self.tokens


def test_nothing_fits_at_the_smallest_haystack_names_the_length_needed():
    """Past the retries and the bisection, the error gives the smallest haystack's total (prompt + the 128
    tokens niah generates)."""
    with pytest.raises(
        KvbenchError,
        match=r"^--length 1024 is too short for ruler/niah_single_1: with the smallest haystack \(1 lines\) a "
        r"prompt takes 2128 tokens with the 128 to generate; use --length >= 2128$",
    ):
        list(ruler_official.official_items(make_task("ruler", "niah_single_1", 0, 1024), 1, _Fixed(2000)))


def test_item_exactly_at_length_fits():
    """RULER keeps a draw whose total equals ``max_seq_length`` (``length <= max_seq_length``)."""
    (ctx,) = ruler_official.official_items(make_task("ruler", "niah_single_1", 0, 1024), 1, _Fixed(1024 - 128))
    assert ctx.meta["prompt_tokens"] == 1024 - 128
    assert ctx.meta["ruler_identical"] is True


@pytest.mark.parametrize("length", [60, 200, 249])
def test_fwe_below_250_tokens_is_too_short(length):
    """fwe's vocabulary is ``(length - 50) // 50`` words and needs at least 4: 250 tokens."""
    with pytest.raises(KvbenchError, match=rf"^--length {length} is too short for ruler/fwe; use --length >= 250$"):
        list(ruler_official.official_items(make_task("ruler", "fwe", 0, length), 1, words))


def test_fwe_at_250_tokens_generates():
    (ctx,) = ruler_official.official_items(make_task("ruler", "fwe", 0, 250), 1, words)
    assert words(ctx) <= 200 and ctx.meta["ruler_identical"] is True


def test_fwe_that_never_fits_is_too_short():
    with pytest.raises(KvbenchError, match=r"^--length 4096 is too short for ruler/fwe; use a longer --length$"):
        list(ruler_official.official_items(make_task("ruler", "fwe", 0, 4096), 1, _Fixed(10**6)))


def test_no_items_requested():
    """No items: nothing is drawn or sized, so even a length too short for fwe is no error."""
    for count in (0, -1):
        assert list(ruler_official.official_items(make_task("ruler", "fwe", 0, 60), count, words)) == []


def test_vt_too_short_error_and_a_failed_draw_at_the_smallest_haystack(monkeypatch):
    """vt at 1,024 tokens under a measure of 10**6 tokens: the estimate (1 draw) and the search over [5, 10]
    (7, then 5 lines) find nothing, the item redraws FLOOR_REDRAWS times at 5 lines, the bisection over
    [5, 4] draws nothing, and the error's own draw at the floor (5 lines, one per variable) is the 68th. If
    that draw fails as RULER's generate_chains does, the error cannot name a length."""
    too_short = r"^--length 1024 is too short for ruler/vt: with the smallest haystack \(5 lines\) a prompt takes "
    with pytest.raises(
        KvbenchError, match=too_short + r"1000030 tokens with the 30 to generate; use --length >= 1000030$"
    ):
        _vt_run(monkeypatch, 0, 1, measure=_Fixed(10**6))
    real, calls = ruler_official._vt_names, []
    monkeypatch.setattr(ruler_official, "_vt_names", lambda run, size: calls.append(size) or real(run, size))
    with pytest.raises(KvbenchError):
        list(ruler_official.official_items(make_task("ruler", "vt", 0, 1024), 1, _Fixed(10**6)))
    monkeypatch.undo()
    assert calls.count(5) == 1 + 2 + ruler_official.FLOOR_REDRAWS + 1 == 68
    with pytest.raises(KvbenchError, match=too_short + r"None tokens with the 30 to generate; use a longer --length$"):
        _vt_run(monkeypatch, 0, 1, measure=_Fixed(10**6), crash=(5, 68))


# ---------------------------------------------------------------------------------------------------
# ruler_official: fwe's growth and shrinking (budget = length - 50, start budget // 6, step budget // 32)


class _Units:
    """A PromptLength of one token per haystack word, plus ``extra`` for the items named in ``items``."""

    def __init__(self, extra=0, items=()):
        self.extra, self.items = extra, items

    def __call__(self, ctx: Context) -> int:
        return ctx.meta["n_haystack"] + (self.extra if ctx.item in self.items else 0)


def test_fwe_grows_until_the_budget_then_backs_off_one_step():
    """length 251: budget 201, start 33, step 6; 33 + 28 * 6 = 201 reaches the budget (RULER grows while
    below it), so the size is 195; item 1 measures 195 + 6 = 201, which does not exceed the budget."""
    items = list(ruler_official.official_items(make_task("ruler", "fwe", 0, 251), 2, _Units(6, ("1",))))
    assert [c.meta["n_haystack"] for c in items] == [195, 195]
    assert all(type(c.meta["n_haystack"]) is int for c in items)
    (ctx,) = ruler_official.official_items(make_task("ruler", "fwe", 0, 250), 1, words)
    assert (ctx.meta["n_haystack"] - 200 // 6) % (200 // 32) == 0 and type(ctx.meta["n_haystack"]) is int


class _FitsAtMost:
    """A PromptLength where only haystacks of at most ``n`` words fit (0 tokens), any other 10**6."""

    def __init__(self, n):
        self.n = n

    def __call__(self, ctx: Context) -> int:
        return 0 if ctx.meta["n_haystack"] <= self.n else 10**6


def test_fwe_shrinks_to_one_word_but_not_to_none():
    """Nothing fits at the start (budget // 6), so the size is one step below it and items shrink by the
    step: at length 272 (budget 222, start 37, step 6) from 31 down to 1 word, which may fit; at length 266
    (budget 216, start 36, step 6) from 30 down to 0 words, which is an error."""
    (ctx,) = ruler_official.official_items(make_task("ruler", "fwe", 0, 272), 1, _FitsAtMost(1))
    assert ctx.meta["n_haystack"] == 1
    with pytest.raises(KvbenchError, match=r"^--length 266 is too short for ruler/fwe; use a longer --length$"):
        list(ruler_official.official_items(make_task("ruler", "fwe", 0, 266), 1, _FitsAtMost(0)))


# ---------------------------------------------------------------------------------------------------
# ruler_official: a step below the smallest size RULER can draw (RULER's loop never ends there)


def _ctx(n: int) -> Context:
    return Context("ruler", "t", "0", "", "x", [], {"n_haystack": n})


class _Draws:
    """A step_down ``draw``: the sizes asked for, fitting (total ``fit``) at or below ``fits`` units."""

    def __init__(self, fits, length=1024):
        self.fits, self.length, self.sizes = fits, length, []

    def __call__(self, n):
        self.sizes.append(n)
        return _ctx(n), (100 if n <= self.fits else self.length + 1)


def _step_down(draws, n, inc, floor, **kw):
    run = ruler_official._Run(make_task("ruler", "niah_single_1", 0, 1024), words)
    return run.step_down(draws, n, inc, floor, **kw), run


def test_step_down_stops_above_the_smallest_drawable_size():
    """From 8 lines with an increment of 5 and a floor of 5, RULER's next draw (3 lines) would raise, forever:
    kvbench redraws at 8 (FLOOR_REDRAWS draws), then bisects [5, 7] (6 fits, 7 does not) and keeps 6."""
    draws = _Draws(fits=6)
    ctx, run = _step_down(draws, 8, 5, 5)
    assert draws.sizes == [8] * ruler_official.FLOOR_REDRAWS + [6, 7]
    assert ctx.meta["n_haystack"] == 6 and ctx.meta["ruler_identical"] is False and run.identical is False


def test_step_down_to_exactly_the_floor_is_rulers():
    draws = _Draws(fits=5)
    ctx, run = _step_down(draws, 10, 5, 5)
    assert draws.sizes == [10, 5]
    assert ctx.meta["n_haystack"] == 5 and ctx.meta["ruler_identical"] is True


def test_step_down_below_the_floor_where_ruler_can_draw():
    """cwe: RULER draws fewer than 10 words (all common), so ``drawable=1`` lets the step go below the floor."""
    draws = _Draws(fits=3)
    ctx, run = _step_down(draws, 8, 5, 5, drawable=1)
    assert draws.sizes == [8, 3]
    assert ctx.meta["n_haystack"] == 3 and ctx.meta["ruler_identical"] is True


class _TooLongFor:
    """One token per word, but 10**6 for item ``item``'s prompts of at least ``units`` haystack units."""

    def __init__(self, item, units):
        self.item, self.units = str(item), units

    def __call__(self, ctx: Context) -> int:
        too_long = ctx.item == self.item and ctx.meta["n_haystack"] >= self.units
        return 10**6 if too_long else words(ctx)


def _length_with_size(task: str, lengths: range, wanted: Callable[[int], bool], why: str) -> tuple[int, int]:
    """The first ``length`` in ``lengths`` whose searched size ``n`` (item 0, one token per word) is ``wanted``,
    and that ``n``; the test fails naming ``why`` when none is."""
    for length in lengths:
        (first,) = ruler_official.official_items(make_task("ruler", task, 0, length), 1, words)
        n = first.meta["n_haystack"]
        if wanted(n):
            return length, n
    pytest.fail(f"no length in {lengths} gives a {task} size {why}")


def test_vt_item_never_steps_below_five_lines():
    """vt at 1,024 tokens (increment 5) from a searched size that is not a multiple of 5: item 1 never fits
    above 5 lines, so it steps down to n % 5 + 5 lines; RULER's next step (n % 5 lines, fewer than the five
    variables) raises on every draw and its loop never ends. kvbench stays, redraws, bisects and keeps 5."""
    length, n = _length_with_size("vt", range(1000, 1100, 7), lambda n: n % 5 != 0, "that is not a multiple of 5")
    items = list(ruler_official.official_items(make_task("ruler", "vt", 0, length), 3, _TooLongFor(1, 6)))
    assert [c.meta["n_haystack"] for c in items] == [n, 5, n]
    assert [c.meta["ruler_identical"] for c in items] == [True, False, False]


def test_qa_item_never_steps_below_its_gold_documents(tmp_path, monkeypatch):
    """qa_2 (the committed HotpotQA-shaped fixture: 10 documents per question, so a floor of 10) at 1,000 tokens
    sizes items at 34 documents, increment 10. Item 1 fits only at 10 or fewer: 34, 24, 14, and RULER's next
    step (4 documents, fewer than the question's own) raises on every draw in a loop that never ends. kvbench
    stays at 14, redraws, bisects [10, 13] and keeps 10 (before: a too-short error for 10 documents)."""
    (tmp_path / "ruler").mkdir()
    shutil.copy(FIXTURES / "hotpotqa.json", tmp_path / "ruler" / "hotpotqa.json")
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path))
    task = make_task("ruler", "qa_2", 0, 1000)
    assert task.floor(1) == 10 and task.incremental() == 10
    items = list(ruler_official.official_items(task, 2, _TooLongFor(1, 11)))
    assert [c.meta["n_haystack"] for c in items] == [34, 10]
    assert [c.meta["ruler_identical"] for c in items] == [True, False]


def test_cwe_item_steps_below_ten_words_as_ruler_does():
    """cwe at 1,024 tokens (increment 10): item 1 fits only below 6 words; from the searched size n (n % 10
    in 1..5) RULER steps down to n % 10 words and draws there; so does kvbench."""
    length, n = _length_with_size("cwe", range(1000, 1200, 7), lambda n: n % 10 in range(1, 6), "with n % 10 in 1..5")
    items = list(ruler_official.official_items(make_task("ruler", "cwe", 0, length), 2, _TooLongFor(1, 6)))
    assert [c.meta["n_haystack"] for c in items] == [n, n % 10]
    assert all(c.meta["ruler_identical"] for c in items)


def test_vt_example_never_steps_below_five_lines(monkeypatch):
    """The one-shot example sized at 9 lines (``extra`` 250 raw tokens): a failed first draw there would step
    RULER down to 4 lines, where every draw raises (5 variables) and its loop never ends; kvbench takes 5
    lines and marks the items as its own."""
    extra = 250
    want = (500 - VT_EXAMPLE_WORDS - extra) // NOISE_WORDS
    assert want == 9
    plain, calls = _vt_run(monkeypatch, 3, 1, length=4096, measure=_Words(extra))
    assert [_icl_lines(c) for c in plain] == [9] and plain[0].meta["ruler_identical"] is True
    items, _ = _vt_run(monkeypatch, 3, 2, crash=(3, calls[3]), length=4096, measure=_Words(extra))
    assert [_icl_lines(c) for c in items] == [5, 5]
    assert [c.meta["ruler_identical"] for c in items] == [False, False]


# ---------------------------------------------------------------------------------------------------
# ruler_official: mutation triage (fwe's shrinking keeps the item, english_words.json's encoding)


def test_fwe_item_shrunk_twice_keeps_its_id():
    """length 251 (budget 201, size 195, step 6), item 1 counts 13 tokens more: 208 and 202 exceed the budget,
    183 + 13 = 196 does not; every redraw is of item 1, so it keeps its id and shrinks two steps."""
    items = list(ruler_official.official_items(make_task("ruler", "fwe", 0, 251), 3, _Units(13, ("1",))))
    assert [c.item for c in items] == ["0", "1", "2"]
    assert [c.meta["n_haystack"] for c in items] == [195, 183, 195]
    assert [c.meta["prompt_tokens"] for c in items] == [195, 196, 195]


def test_cwe_english_words_are_read_as_utf8_whatever_the_locale(tmp_path, monkeypatch):
    """JSON text is UTF-8 (RFC 8259): where the locale's default encoding is Latin-1 (simulated: ``open``
    without an encoding reads Latin-1, which would decode "é" as "Ã©") the words still come back as written."""
    (tmp_path / "ruler").mkdir()
    (tmp_path / "ruler" / "english_words.json").write_text(json.dumps(FALLBACK, ensure_ascii=False), encoding="utf-8")
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path))
    real_open = open

    def latin1_locale_open(file, mode="r", *args, encoding=None, **kwargs):
        return real_open(file, mode, *args, encoding=encoding or ("latin-1" if "b" not in mode else None), **kwargs)

    monkeypatch.setattr(ruler_official, "open", latin1_locale_open, raising=False)
    assert _CweWords(["a", "b"]).fallback(3) == [f"word{i}é" for i in range(30)]


class _DrawsFailingAt(_Draws):
    """``_Draws`` where RULER's draw raises (``None``) at the sizes in ``fail``."""

    def __init__(self, fits, fail):
        super().__init__(fits)
        self.fail = fail

    def __call__(self, n):
        got = super().__call__(n)
        return None if n in self.fail else got


def test_step_down_bisection_counts_a_failed_draw_as_too_long():
    """As ``test_step_down_stops_above_the_smallest_drawable_size``, but the draw at 6 lines raises: the
    bisection over [5, 7] takes that as too long (6 fails, then 5 fits) and keeps 5 lines."""
    draws = _DrawsFailingAt(fits=6, fail={6})
    ctx, _ = _step_down(draws, 8, 5, 5)
    assert draws.sizes == [8] * ruler_official.FLOOR_REDRAWS + [6, 5]
    assert ctx.meta["n_haystack"] == 5 and ctx.meta["ruler_identical"] is False


def test_cwe_item_steps_down_to_a_single_word():
    """As ``test_cwe_item_steps_below_ten_words_as_ruler_does`` from a size n with n % 10 == 1: RULER's
    step lands on 1 word (one common word, no uncommon ones), a draw it makes, and so does kvbench."""
    length, n = _length_with_size("cwe", range(1000, 1200, 7), lambda n: n % 10 == 1, "with n % 10 == 1")
    items = list(ruler_official.official_items(make_task("ruler", "cwe", 0, length), 2, _TooLongFor(1, 2)))
    assert [c.meta["n_haystack"] for c in items] == [n, 1]
    assert len(items[1].meta["common"]) == 1 and all(c.meta["ruler_identical"] for c in items)


class _CountingAt4096:
    """One token per word, but ``tokens`` for a haystack of 4,096 words or more (RULER's cwe sample); records
    every size measured."""

    def __init__(self, tokens):
        self.tokens, self.sizes = tokens, []

    def __call__(self, ctx: Context) -> int:
        self.sizes.append(ctx.meta["n_haystack"])
        return self.tokens if ctx.meta["n_haystack"] >= 4096 else words(ctx)


def test_cwe_search_range_when_the_estimate_is_small():
    """cwe at 1,024 tokens: RULER's 4,096-word sample takes 10**6 tokens, so the estimate is
    int(1024 // (10**6 / 4096)) * 2 = 8 words and the search runs over [10, max(8, 2 * 10)]: 15, 18, 19, 20
    all fit (one token per word), so every item starts, and stays, at 20 words."""
    measure = _CountingAt4096(10**6)
    items = list(ruler_official.official_items(make_task("ruler", "cwe", 0, 1024), 2, measure))
    assert measure.sizes == [4096, 15, 18, 19, 20, 20, 20]
    assert [c.meta["n_haystack"] for c in items] == [20, 20]


def test_cwe_nothing_fits_names_the_length_needed():
    """The search finds nothing, so items start at the increment (10 words): the redraws there and the
    bisection over [10, 9] fail, and the error gives the total at cwe's smallest haystack (10 words)."""
    gen_tokens = make_task("ruler", "cwe", 0, 1024).gen
    need = 10**6 + gen_tokens
    with pytest.raises(
        KvbenchError,
        match=rf"^--length 1024 is too short for ruler/cwe: with the smallest haystack \(10 words\) a prompt takes "
        rf"{need} tokens with the {gen_tokens} to generate; use --length >= {need}$",
    ):
        list(ruler_official.official_items(make_task("ruler", "cwe", 0, 1024), 1, _Fixed(10**6)))


@pytest.mark.parametrize(
    "extra, lines, after, identical",
    [
        (300, 6, 5, False),  # 6 - 5 = 1 line: RULER's loop never ends, kvbench takes 5 lines
        (230, 10, 5, True),  # 10 - 5 = 5 lines: a step RULER takes and draws at
        (215, 11, 6, True),
    ],
)
def test_vt_example_failed_first_draw_steps_to_five_lines_at_least(extra, lines, after, identical, monkeypatch):
    """The one-shot example sized at ``lines`` lines ((500 - 72 - ``extra``) // 19) whose first draw in
    RULER's retry loop fails: the loop steps 5 lines down where that leaves at least 5 (RULER's step, the items
    stay RULER's), else goes to 5 lines (kvbench's, as ``test_vt_example_never_steps_below_five_lines``)."""
    assert (500 - VT_EXAMPLE_WORDS - extra) // NOISE_WORDS == lines
    plain, calls = _vt_run(monkeypatch, 3, 1, length=4096, measure=_Words(extra))
    assert [_icl_lines(c) for c in plain] == [lines]
    items, _ = _vt_run(monkeypatch, 3, 2, crash=(3, calls[3]), length=4096, measure=_Words(extra))
    assert [_icl_lines(c) for c in items] == [after, after]
    assert [c.meta["ruler_identical"] for c in items] == [identical, identical]


def test_cwe_search_range_from_rulers_estimate():
    """cwe at 1,024 tokens with 99,865 tokens for the 4,096-word sample: RULER's estimate is
    int(1024 // (99865 / 4096)) * 2 = 41 * 2 = 82 words (1024 * 4096 / 99865 = 41.99996), so the search over
    [10, 82], where every size fits, draws 46, 64, 73, 78, 80, 81, 82 and the items start at 82 words."""
    measure = _CountingAt4096(99865)
    items = list(ruler_official.official_items(make_task("ruler", "cwe", 0, 1024), 1, measure))
    assert measure.sizes == [4096, 46, 64, 73, 78, 80, 81, 82, 82]
    assert [c.meta["n_haystack"] for c in items] == [82]


def test_official_niah_meta_names_the_keys_and_values_hidden_in_the_haystack():
    """niah_multikey_2 (a line haystack: no essays needed) at 1,024 tokens: the meta's keys and values are the
    drawn needles' (each key and its value on one needle line of the body), and the values are the answers."""
    items = list(ruler_official.official_items(make_task("ruler", "niah_multikey_2", 0, 1024), 2, words))
    for ctx in items:
        keys, values = ctx.meta["keys"], ctx.meta["values"]
        assert len(keys) == len(values) == 1 and ctx.questions[0].references == tuple(values[0])
        needle_lines = [line for line in ctx.body.split("\n") if keys[0] in line]
        assert len(needle_lines) == 1 and values[0][0] in needle_lines[0]
