"""Edges of RULER's task generators (:mod:`kvbench.tasks.ruler_tasks`) driven directly, as ``per_item`` drives them.

The generators' ``build(item, n)`` draws item ``item`` from ``Random(f"{seed}:{task}:{item}")`` (RULER's draw
order, replayed here by hand); vt's ``prepare`` sizes its one-shot example to the largest that fits 500 raw-text
tokens, checked with a tokenizer whose count of the example is known exactly.
"""

from __future__ import annotations

import itertools
import json
import locale
import math
import os
import random
import re
import string
import sys
import tracemalloc
import uuid

import pytest

from kvbench.errors import KvbenchError, MissingDataError
from kvbench.tasks import Context, ruler_tasks
from kvbench.tasks.ruler_data import DEPTHS, NIAH_CONFIGS, NiahKeys, niah_keys, singularize, split_sentences

from .test_ruler import ESSAY, NOISE, TASKS, VT_TEMPLATE, data_dir, numbered, resolve  # noqa: F401 (data_dir: fixture)

SEED = 42
VT_HEAD = VT_TEMPLATE.split("{context}")[0]
EXAMPLE_END = "they are: "


def item_rng(task: str, item: int) -> random.Random:
    """The item's own RNG as :class:`~kvbench.tasks.ruler_tasks.RulerTask` documents it."""
    return random.Random(f"{SEED}:{task}:{item}")


def names_drawn(rng: random.Random, count: int, size: int) -> list[str]:
    """``count`` distinct names of ``size`` capital letters, first-come from ``rng.choices`` (RULER's vt)."""
    out: list[str] = []
    while len(out) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=size))
        if name not in out:
            out.append(name)
    return out


def prompt_chars(ctx: Context) -> int:
    """A PromptLength counting characters of the whole prompt, where RULER's noise sentence is one empty token:
    each noise line of vt's example then costs exactly its newline."""
    q = ctx.questions[0]
    text = ctx.instruction + "\n" + ctx.body + "\n" + q.text + " " + q.answer_prefix
    return 3 + len(text.replace(NOISE, ""))


def plain_chars(ctx: Context) -> int:
    """A PromptLength counting every character (a noise line alone is ~90 tokens)."""
    q = ctx.questions[0]
    return 3 + len(ctx.instruction + "\n" + ctx.body + "\n" + q.text + " " + q.answer_prefix)


def vt_example(ctx: Context) -> tuple[str, list[str]]:
    """vt's one-shot example (its input up to ``they are: ``) and its answer names, from the instruction."""
    head, sep, rest = ctx.instruction.partition(EXAMPLE_END)
    assert sep and head.startswith(VT_HEAD)
    answer, glue, tail = rest.partition("\n\n")
    assert glue and tail == "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
    assert answer.startswith(" ")
    return head + sep, answer[1:].split(" ")


# --- niah -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("item", [0, 3])
def test_niah_build_draws_the_needle_from_the_items_rng(item):
    gen = ruler_tasks.make_task("ruler", "niah_single_1", SEED, 4096)
    ctx = gen.build(item, 30)
    rng = item_rng("niah_single_1", item)
    keys = niah_keys()
    key = keys[rng.randrange(len(keys))]  # RULER: one random.choice of the key words
    value = str(rng.randint(10**6, 10**7 - 1))  # then a 7-digit number
    assert ctx.item == str(item)
    assert ctx.meta["keys"] == [key] and ctx.meta["values"] == [[value]] and ctx.meta["queries"] == [key]
    assert ctx.questions[0].references == (value,)
    lines = ctx.body.split("\n")
    assert len(lines) == 31 and lines.count(NOISE) == 30
    assert f"One of the special magic numbers for {key} is: {value}." in lines


# --- vt ---------------------------------------------------------------------------------------------


def vt_draws(item: int, n: int):
    """RULER's vt draw order from the item's RNG: 5 five-letter names, the value in [10000, 99999), 5 three-letter
    example names, the example value, then the 5 chain positions among the ``n`` noise lines."""
    rng = item_rng("vt", item)
    names = names_drawn(rng, 5, 5)
    value = rng.randint(10000, 99998)
    icl_names = names_drawn(rng, 5, 3)
    icl_value = rng.randint(10000, 99998)
    positions = sorted(rng.sample(range(n), 5))
    return names, value, icl_names, icl_value, positions


@pytest.mark.parametrize("item", [0, 7])
def test_vt_build_follows_rulers_draws(item):
    n = 12
    gen = ruler_tasks.make_task("ruler", "vt", SEED, 4096)
    ctx = gen.build(item, n)
    names, value, icl_names, icl_value, positions = vt_draws(item, n)
    q = ctx.questions[0]
    assert ctx.item == str(item)
    assert q.references == tuple(names) and ctx.meta["chain"] == names and ctx.meta["value"] == value
    assert q.text == f"Question: Find all variables that are assigned the value {value} in the text above."
    assert q.answer_prefix == (
        "Answer: According to the chain(s) of variable assignment in the text above, 5 variables are assigned "
        f"the value {value}, they are: "
    )
    lines = ctx.body.split("\n")
    chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(4)]
    # chain line j sits before noise line positions[j]: at index positions[j] + j of the body
    assert [i for i, line in enumerate(lines) if line != NOISE] == [p + j for j, p in enumerate(positions)]
    assert [line for line in lines if line != NOISE] == chain and len(lines) == n + 5
    assert {v for v, x in resolve(ctx.body).items() if x == value} == set(names)
    # the one-shot example: its own names and value, 5 noise lines before prepare, answered by its names
    example, answer = vt_example(ctx)
    assert answer == icl_names
    assert example.endswith(f"5 variables are assigned the value {icl_value}, {EXAMPLE_END}")
    assert f"assigned the value {icl_value} in the text above." in example
    ex_lines = example[len(VT_HEAD) :].split("\nQuestion: ")[0].split("\n")
    assert ex_lines.count(NOISE) == 5 and len(ex_lines) == 10
    assert [line for line in ex_lines if line != NOISE] == [f"VAR {icl_names[0]} = {icl_value}"] + [
        f"VAR {icl_names[j + 1]} = VAR {icl_names[j]} " for j in range(4)
    ]


@pytest.mark.parametrize(("item", "which"), [(309934, "value"), (9032, "example value")])
def test_vt_values_exclude_99999(item, which):
    """RULER draws values with ``np.random.randint(10000, 99999)`` (high exclusive); these items are where a draw
    over ``[10000, 99999]`` would give 99999."""
    gen = ruler_tasks.make_task("ruler", "vt", SEED, 4096)
    ctx = gen.build(item, 6)
    _, value, _, icl_value, _ = vt_draws(item, 6)
    assert 99999 not in (value, icl_value)
    assert ctx.meta["value"] == value
    assert vt_example(ctx)[0].endswith(f"the value {icl_value}, {EXAMPLE_END}")


def test_vt_floor_is_the_least_haystack_that_builds():
    gen = ruler_tasks.make_task("ruler", "vt", SEED, 4096)
    gen.build(0, 5)  # 5 chain lines need 5 distinct noise-line positions
    with pytest.raises(ValueError):
        gen.build(0, 4)
    assert gen.floor(0) == 5 and gen.floor(3) == 5


def test_vt_prepare_sizes_the_example_to_exactly_500_tokens():
    """With :func:`prompt_chars` a noise line costs one token, so the largest example within 500 raw-text tokens
    has exactly 500 (RULER counts the example's raw text, template included)."""
    gen = ruler_tasks.make_task("ruler", "vt", SEED, 4096)
    gen.prepare(prompt_chars)
    for item in (0, 1):
        ctx = gen.build(item, 8)
        example, answer = vt_example(ctx)
        assert len(example.replace(NOISE, "")) == 500
        ex_lines = example[len(VT_HEAD) :].split("\nQuestion: ")[0].split("\n")
        n = ex_lines.count(NOISE)
        assert n > 5 and len(ex_lines) == n + 5 and ctx.meta["icl_lines"] == n
        icl_value = int(re.search(r"the value (\d+), they are: $", example).group(1))
        assert {v for v, x in resolve(example).items() if x == icl_value} == set(answer) and len(answer) == 5
        assert all(re.fullmatch(r"[A-Z]{3}", a) for a in answer)


def test_vt_prepare_keeps_five_lines_when_nothing_fits():
    gen = ruler_tasks.make_task("ruler", "vt", SEED, 4096)
    gen.prepare(plain_chars)  # 5 noise lines alone are ~470 characters: no example fits 500
    ctx = gen.build(0, 8)
    example, answer = vt_example(ctx)
    ex_lines = example[len(VT_HEAD) :].split("\nQuestion: ")[0].split("\n")
    assert ex_lines.count(NOISE) == 5 and len(ex_lines) == 10 and ctx.meta["icl_lines"] == 5
    assert len(answer) == 5


# --- cwe ---------------------------------------------------------------------------------------------


def test_cwe_build_example_and_items():
    gen = ruler_tasks.make_task("ruler", "cwe", SEED, 4096)
    bodies = set()
    for item in (0, 1, 2):
        ctx = gen.build(item, 40)
        assert ctx.item == str(item)
        head = "ones that appear most often.\n"
        example = ctx.instruction.split(head, 1)[1].split("\nQuestion: ")[0]
        listed = numbered(example)
        counts = {w: listed.count(w) for w in set(listed)}
        # length >= 4096: 40 example words, 10 of them 10 times and 30 of them 3 times
        assert sorted(counts.values()) == [3] * 30 + [10] * 10
        ex_answer = numbered(ctx.instruction.split("most often in the list are: ", 1)[1].split("\n")[0])
        assert sorted(ex_answer) == sorted(w for w, c in counts.items() if c == 10)
        bodies.add(ctx.body)
    assert len(bodies) == 3  # one RNG per item


# --- fwe ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("length", "step"), [(20, 1), (40, 1), (100, 3), (4096, 128)])
def test_fwe_incremental_is_a_32nd_of_the_length(length, step):
    inc = ruler_tasks.make_task("ruler", "fwe", SEED, length).incremental()
    assert inc == step and type(inc) is int


def test_fwe_build_items():
    gen = ruler_tasks.make_task("ruler", "fwe", SEED, 4096)
    tops = set()
    for item in (0, 1, 2):
        ctx = gen.build(item, 300)
        assert ctx.item == str(item)
        tops.add(tuple(ctx.questions[0].references))
        assert ctx.meta["top"] == list(ctx.questions[0].references)
    assert len(tops) == 3  # one RNG per item: a fresh coded vocabulary each


# --- qa ----------------------------------------------------------------------------------------------


def test_qa_build_draws_the_distractors_from_the_items_rng(data_dir):  # noqa: F811
    gen = ruler_tasks.make_task("ruler", "qa_1", SEED, 4096)
    for item in range(5):  # 1 gold + 2 same-article documents of 5: n = 4 samples one other document
        ctx = gen.build(item, 4)
        assert ctx.meta["dataset"] == "squad" and ctx.meta["question_index"] == item
        assert ctx.meta["query"] == gen.qas[item]["query"] and ctx.meta["n_haystack"] == 4
        chosen = gen.choose(item_rng("qa_1", item), item, 4)
        assert ctx == gen.assemble(item, 4, chosen)


# --- search ------------------------------------------------------------------------------------------


def test_search_largest_against_brute_force():
    """Every monotone ``fits`` (``n <= t``) over small ranges and every start: the largest fitting ``n`` in
    ``[lo, hi]`` (None when ``lo`` does not fit or the range is empty), probing only inside the range, never
    twice the same ``n``, within ``2 * ceil(log2(width + 1)) + 1`` calls."""
    for lo in range(3):
        for hi in range(lo - 2, lo + 40):
            width = hi - lo + 1
            bound = 2 * math.ceil(math.log2(width + 1)) + 1 if width > 0 else 0
            for start in range(lo - 2, hi + 3):
                for t in range(lo - 2, hi + 2):
                    calls: list[int] = []

                    def fits(n: int, t: int = t, calls: list[int] = calls) -> bool:
                        calls.append(n)
                        assert len(calls) <= 64, "endless search"
                        return n <= t

                    expected = max((n for n in range(lo, hi + 1) if n <= t), default=None)
                    assert ruler_tasks.search_largest(fits, lo, hi, start) == expected, (lo, hi, start, t)
                    assert all(lo <= n <= hi for n in calls) and len(set(calls)) == len(calls), (lo, hi, start, t)
                    assert len(calls) <= bound, (lo, hi, start, t, calls)


def test_qa_cap_covers_the_gold_documents_of_a_one_question_file():
    """A haystack of ``length`` documents at most (each costs a token), but never fewer than the gold documents;
    a data file may hold a single question."""
    qas = [{"query": "Who?", "outputs": ["Ann"], "context": [0, 1, 2], "more_context": []}]
    docs = ["Ann wrote it.", "Bob read it.", "Cy sold it.", "Di lost it."]
    assert ruler_tasks._Qa("ruler", "qa_2", SEED, 2, (qas, docs)).cap() == 3
    assert ruler_tasks._Qa("ruler", "qa_2", SEED, 50, (qas, docs)).cap() == 50


# --- data files --------------------------------------------------------------------------------------

FIX = (
    "`kvbench data fetch ruler --data-dir DIR` fetches it (online), then pass --data-dir DIR (or set "
    "KVBENCH_DATA_DIR=DIR); or put {rel} under such a directory by hand"
)


def test_data_dir_unset_blank_or_home(monkeypatch, tmp_path):
    monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
    assert ruler_tasks.data_dir() is None
    monkeypatch.setenv("KVBENCH_DATA_DIR", "  \t")
    assert ruler_tasks.data_dir() is None
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KVBENCH_DATA_DIR", " ~/data ")
    assert ruler_tasks.data_dir() == tmp_path / "data"


@pytest.mark.parametrize(
    ("task", "rel"),
    [("niah_single_2", "ruler/PaulGrahamEssays.json"), ("qa_1", "ruler/squad.json"), ("qa_2", "ruler/hotpotqa.json")],
)
def test_data_path_messages(task, rel, monkeypatch, tmp_path):
    fix = re.escape(FIX.format(rel=rel))
    monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
    with pytest.raises(
        MissingDataError, match=rf"^RULER task {task} needs {rel}, but KVBENCH_DATA_DIR is not set: {fix}$"
    ):
        ruler_tasks.data_path(task)
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path))
    path = tmp_path / rel
    with pytest.raises(
        MissingDataError, match=rf"^RULER task {task} needs {re.escape(str(path))}, which does not exist: {fix}$"
    ):
        ruler_tasks.data_path(task)
    path.parent.mkdir()
    path.mkdir()  # a directory is not the file
    with pytest.raises(MissingDataError, match=r"which does not exist"):
        ruler_tasks.data_path(task)
    path.rmdir()
    path.write_text("{}")
    assert ruler_tasks.data_path(task) == path


def test_essay_is_read_once_per_file_version_and_shared(monkeypatch, tmp_path):
    essay = tmp_path / "ruler" / "PaulGrahamEssays.json"
    essay.parent.mkdir()
    essay.write_text(json.dumps({"text": " One  two.\n\nThree\tfour. "}), encoding="utf-8")
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path))
    first = ruler_tasks.make_task("ruler", "niah_single_2", SEED, 4096).essay
    assert first.words == ["", "One", "two.", "Three", "four.", ""]  # RULER: re.sub(r"\s+", " ", text).split(" ")
    assert ruler_tasks.make_task("ruler", "niah_multikey_1", 1, 1000).essay is first  # one parse for every essay task
    essay.write_text(json.dumps({"text": "Five six seven."}), encoding="utf-8")
    again = ruler_tasks.make_task("ruler", "niah_single_2", SEED, 4096).essay
    assert again.words == ["Five", "six", "seven."]


@pytest.mark.parametrize("content", ['["text"]', '{"text": 3}', '{"text": " \\n "}', '{"essay": "a"}'])
def test_essay_file_of_the_wrong_shape(content, monkeypatch, tmp_path):
    essay = tmp_path / "ruler" / "PaulGrahamEssays.json"
    essay.parent.mkdir()
    essay.write_text(content, encoding="utf-8")
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path))
    shape = 'expected {"text": "<non-empty essay text>"}'
    expected = re.escape(f"RULER data file {essay}: {shape}; {ruler_tasks.REFETCH}")
    with pytest.raises(KvbenchError, match=rf"^{expected}$"):
        ruler_tasks.make_task("ruler", "niah_single_3", SEED, 4096)


@pytest.mark.parametrize("content", [b"{", b'{"text": "\xff"}'])
def test_unreadable_essay_file(content, monkeypatch, tmp_path):
    essay = tmp_path / "ruler" / "PaulGrahamEssays.json"
    essay.parent.mkdir()
    essay.write_bytes(content)
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path))
    with pytest.raises(KvbenchError, match=rf"^cannot read RULER data file {re.escape(str(essay))}: .+$"):
        ruler_tasks.make_task("ruler", "niah_single_2", SEED, 4096)


def test_search_largest_gallops_from_a_good_start():
    """Galloping from ``start``: a start on the boundary or one past it costs two probes."""
    for start in (3, 10, 57):
        for t in (start, start - 1):
            calls: list[int] = []

            def fits(n: int, t: int = t, calls: list[int] = calls) -> bool:
                calls.append(n)
                return n <= t

            assert ruler_tasks.search_largest(fits, 1, 100, start) == t
            assert sorted(calls) == ([start - 1, start] if t < start else [start, start + 1])


def test_essay_sentences_repeat_the_text_as_rulers():
    """The sentences of the essay's first ``n`` words, the word list cycled when ``n`` exceeds it; cached
    answers stay right as the cache turns over."""
    words = ["Alpha", "beta.", "Gamma", "delta", "eps!", "Zeta", "eta."]
    essay = ruler_tasks._Essay(list(words))
    for n in [1, 3, 7, 8, 13, 14, 15, 22, 3, 50, *range(60, 140), 8, 14, 1]:
        expected = split_sentences(" ".join(itertools.islice(itertools.cycle(words), n)))
        assert essay.sentences(n) == expected, n


def test_needle_part_kinds():
    """RULER's draws: 7-digit ``randint(10**6, 10**7 - 1)``, ``UUID(int=getrandbits(128), version=4)``, one
    choice of the key words."""
    for seed in range(20):
        rng = random.Random(seed)
        number = ruler_tasks.draw_needle_part(rng, "numbers")
        assert number == str(random.Random(seed).randint(10**6, 10**7 - 1)) and re.fullmatch(r"[1-9]\d{6}", number)
        assert ruler_tasks.draw_needle_part(rng, "uuids") == str(
            uuid.UUID(int=rng_after(seed, 1).getrandbits(128), version=4)
        )
        keys = niah_keys()
        assert ruler_tasks.draw_needle_part(rng, "words") == keys[rng_after(seed, 2).randrange(len(keys))]
    with pytest.raises(ValueError, match=r"^unknown needle kind 'uuid'$"):
        ruler_tasks.draw_needle_part(random.Random(0), "uuid")


def rng_after(seed: int, draws: int) -> random.Random:
    """``Random(seed)`` after :func:`test_needle_part_kinds`' first ``draws`` draws (a number, then a uuid)."""
    rng = random.Random(seed)
    if draws >= 1:
        rng.randint(10**6, 10**7 - 1)
    if draws >= 2:
        rng.getrandbits(128)
    return rng


def test_make_task_unknown():
    valid = ", ".join(TASKS)
    with pytest.raises(ValueError, match=rf"^unknown RULER task 'niah_single_9'; valid tasks: {valid}$"):
        ruler_tasks.make_task("ruler", "niah_single_9", SEED, 4096)


def test_qa_choose_gold_then_same_article_then_others_or_everything_repeated():
    qas = [
        {"query": "q0", "outputs": ["a"], "context": [2, 5], "more_context": [7, 1, 8]},
        {"query": "q1", "outputs": ["b"], "context": [], "more_context": []},
    ]
    docs = [f"doc {i}" for i in range(10)]
    gen = ruler_tasks._Qa("ruler", "qa_2", SEED, 4096, (qas, docs))
    assert gen.n_items() == 2 and gen.floor(0) == 2 and gen.floor(1) == 1 and gen.dataset == "hotpotqa"
    with pytest.raises(ValueError):
        gen.choose(random.Random(0), 0, 1)  # fewer documents than gold ones
    for seed in range(8):
        for n in range(2, 10):
            chosen = gen.choose(random.Random(seed), 0, n)
            assert len(chosen) == n == len(set(chosen)) and {2, 5} <= set(chosen)
            rest = set(chosen) - {2, 5}
            if n <= 5:
                assert rest <= {7, 1, 8}
            else:
                assert {7, 1, 8} <= rest
    for seed in range(8):  # n = gold + same-article: RULER's gold + random.sample(more, 3), Random(seed)-shuffled
        expected = [2, 5, *random.Random(seed).sample([7, 1, 8], 3)]
        random.Random(SEED).shuffle(expected)
        assert gen.choose(random.Random(seed), 0, 5) == expected
    for n in (10, 23, 30):  # RULER's whole list, repeated, cut at n, shuffled by Random(seed)
        expected = (list(range(10)) * 3)[:n]
        random.Random(SEED).shuffle(expected)
        assert gen.choose(random.Random(1), 0, n) == expected


@pytest.mark.parametrize(("length", "vocab"), [(4096, 80), (8192, 162), (340, 5), (350, 6), (100, 5)])
def test_fwe_vocabulary_size(length, vocab):
    """RULER's ``max_seq_length // 50`` coded words, counted on the prompt's share (length - 50), at least 5."""
    gen = ruler_tasks.make_task("ruler", "fwe", SEED, length)
    assert gen.build(0, 2000).meta["vocab_size"] == vocab


def test_fwe_floor_is_the_least_count_separating_rank_four_from_five():
    zeta = math.pi**2 / 6
    least = next(n for n in itertools.count(1) if int(n / 16 / zeta) > int(n / 25 / zeta))
    assert ruler_tasks.make_task("ruler", "fwe", SEED, 4096).floor(0) == least


def test_fwe_vocabulary_redraws_colliding_words():
    """``size`` distinct 6-letter words even when the first draws collide (item 181's 2000 draws repeat a word),
    the top rank replaced by '...'."""
    gen = ruler_tasks.make_task("ruler", "fwe", SEED, 4096)
    first = item_rng("fwe", 181)
    drawn = ["".join(first.choices(string.ascii_lowercase, k=6)) for _ in range(2000)]
    assert len(set(drawn)) == 1999  # the collision this test is about
    vocab = gen.vocab(item_rng("fwe", 181), 2000)
    assert len(vocab) == len(set(vocab)) == 2000 and vocab.count("...") == 1 and vocab[0] == "..."
    assert all(re.fullmatch(r"[a-z]{6}", w) for w in vocab[1:])
    assert len(set(drawn) - set(vocab)) <= 1  # every drawn word kept, but the one rank 0's '...' replaces


# --- defaults and key list ---------------------------------------------------------------------------


class _OneUnitTask(ruler_tasks.RulerTask):
    """A task family that declares no floor of its own (a plugin's, say)."""

    family = "niah"

    def incremental(self) -> int:
        return 1

    def build(self, item: int, n: int) -> Context:
        raise NotImplementedError


def test_a_task_without_its_own_floor_needs_one_unit():
    """``RulerTask``'s default: a haystack needs one unit, so the cap is ``length`` but at least 1."""
    assert _OneUnitTask("ruler", "niah_single_1", SEED, 7).floor(0) == 1
    assert _OneUnitTask("ruler", "niah_single_1", SEED, 0).cap() == 1
    assert _OneUnitTask("ruler", "niah_single_1", SEED, 7).cap() == 7


def test_niah_keys_builds_no_key_of_a_one_adjective_group():
    """``NiahKeys`` indexes the adjective-noun product without building it: 300 lone adjectives x 1,000 nouns
    (300,000 keys, each string at least ``sys.getsizeof("")`` bytes) cost a small fraction of that; only the
    one shared-root group (``aaa``, ``aaa-b``, ``aaa-c``: 3,000 keys) is built, to check it for duplicates."""
    adjs = ["".join(p) for p in itertools.islice(itertools.product(string.ascii_lowercase, repeat=3), 300)]
    nouns = ["".join(p) for p in itertools.islice(itertools.product(string.ascii_lowercase, repeat=4), 1000)]
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        keys = NiahKeys([*adjs, "aaa-b", "aaa-c"], nouns)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()
    assert len(keys) == 302 * 1000
    assert peak < len(keys) * sys.getsizeof("") / 10, peak
    assert keys[3000] == "aab-aaaa" and keys[1] == "aaa-aaab" and keys[1000] == "aaa-b-aaaa"


def test_niah_keys_index_every_key_and_refuse_the_rest():
    """The keys in RULER's sorted order at 0..len - 1; any other index (negative ones too) is an IndexError naming
    it."""
    adjs, nouns = ["red", "blue", "blue-eyed"], ["ox", "cat", "eye"]
    keys = NiahKeys(adjs, nouns)
    assert [keys[i] for i in range(len(keys))] == sorted({f"{a}-{n}" for a in adjs for n in nouns})
    for bad in (len(keys), len(keys) + 1, -1):
        with pytest.raises(IndexError, match=rf"^{bad}$"):
            keys[bad]


def test_singularize_is_niah_pys_four_replacements():
    """niah.py (one value asked for): ``Some`` -> ``A``, ``are all`` -> ``is``, ``are`` -> ``is``, ``answers`` ->
    ``answer``, in that order (``are all`` first, else it would become ``is all``)."""
    assert singularize("Some answers are all here; they are") == "A answer is here; they is"
    assert (
        singularize("What are all the special magic {type_v} for {query}?")
        == "What is the special magic {type_v} for {query}?"
    )


class _Scripted(random.Random):
    """A ``Random`` whose ``getrandbits`` returns the given numbers in turn (every integer draw goes through it)."""

    def __init__(self, bits: list[int]):
        super().__init__(0)
        self.bits = list(bits)

    def getrandbits(self, k: int) -> int:
        return self.bits.pop(0)


def test_needle_numbers_span_exactly_the_seven_digit_range():
    """RULER's ``randint(10**6, 10**7 - 1)`` draws 24 random bits until they fall below the 9,000,000 numbers of the
    range: the last accepted draw (8,999,999) is 9,999,999, and draws of 9,000,000 and 9,000,001 are redrawn."""
    assert ruler_tasks.draw_needle_part(_Scripted([8_999_999]), "numbers") == "9999999"
    assert ruler_tasks.draw_needle_part(_Scripted([9_000_000, 9_000_001, 5]), "numbers") == "1000005"


def write_essay(root, text: str):
    path = root / "ruler" / "PaulGrahamEssays.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"text": text}), encoding="utf-8")
    return path


def test_another_essay_file_of_the_same_size_and_time_is_read(monkeypatch, tmp_path):
    """A file is known by its path as well as its size and modification time: a second data directory whose essay
    has the same size and mtime is still read anew."""
    first = write_essay(tmp_path / "a", "One two three.")
    second = write_essay(tmp_path / "b", "Six ten eight.")
    stamp = first.stat().st_mtime_ns
    for path in (first, second):
        os.utime(path, ns=(stamp, stamp))
    assert first.stat().st_size == second.stat().st_size
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path / "a"))
    assert ruler_tasks.make_task("ruler", "niah_single_2", SEED, 4096).essay.words == ["One", "two", "three."]
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path / "b"))
    assert ruler_tasks.make_task("ruler", "niah_single_2", SEED, 4096).essay.words == ["Six", "ten", "eight."]


def test_each_data_file_stays_parsed_while_the_others_are_read(data_dir):  # noqa: F811
    """SQuAD, HotpotQA and the essays are parsed once each: reading one does not drop another's parse."""
    squad = ruler_tasks.make_task("ruler", "qa_1", SEED, 4096)
    hotpot = ruler_tasks.make_task("ruler", "qa_2", SEED, 4096)
    essay = ruler_tasks.make_task("ruler", "niah_single_2", SEED, 4096)
    assert ruler_tasks.make_task("ruler", "qa_1", SEED, 1024).qas is squad.qas
    assert ruler_tasks.make_task("ruler", "qa_2", SEED, 1024).qas is hotpot.qas
    assert ruler_tasks.make_task("ruler", "niah_single_3", SEED, 1024).essay is essay.essay
    assert squad.qas != hotpot.qas


# --- niah floors and metadata ------------------------------------------------------------------------

ESSAY_WORDS = "Alpha beta gamma. Delta eps zeta eta. Theta iota. Kappa lambda mu nu. Xi omicron.".split(" ")


def niah_task(task: str) -> ruler_tasks.RulerTask:
    essay = ruler_tasks._Essay(list(ESSAY_WORDS)) if NIAH_CONFIGS[task].haystack == "essay" else None
    return ruler_tasks._Niah("ruler", task, SEED, 4096, essay)


@pytest.mark.parametrize("task", [t for t in TASKS if t.startswith("niah")])
def test_niah_floor_is_one_unit_for_every_task(task):
    """An essay haystack needs one word whatever its needle count (needles go between sentences); a line haystack
    one line per needle (each needle takes a distinct line index), and every line-haystack task has one needle: 1
    for every niah task. One unit builds; a line haystack of 0 lines does not."""
    gen = niah_task(task)
    floor = gen.floor(0)
    assert floor == 1 and type(floor) is int
    assert len(gen.build(0, floor).meta["depths"]) == NIAH_CONFIGS[task].num_k * NIAH_CONFIGS[task].num_v
    if NIAH_CONFIGS[task].haystack != "essay":
        with pytest.raises(ValueError):
            gen.build(0, floor - 1)


@pytest.mark.parametrize("task", ["niah_single_1", "niah_multikey_3", "niah_multikey_1", "niah_multivalue"])
def test_niah_meta_records_the_unit_and_each_needles_relative_depth(task):
    """``unit``: words for an essay haystack, lines otherwise; ``depths``: each needle's character offset in the
    body over the body's length, to 4 decimals (offsets counted here from the pieces around the needle)."""
    cfg = NIAH_CONFIGS[task]
    ctx = niah_task(task).build(3, 12)
    assert ctx.meta["unit"] == ("words" if cfg.haystack == "essay" else "lines")
    assert ctx.meta["haystack"] == cfg.haystack and ctx.meta["n_haystack"] == 12
    needles = [
        f"One of the special magic {cfg.type_v} for {k} is: {v}."
        for k, vs in zip(ctx.meta["keys"], ctx.meta["values"], strict=True)
        for v in vs
    ]
    body = ctx.body
    raw = []
    for needle in needles:
        before, sep, _ = body.partition(needle)
        assert sep and needle not in before
        raw.append(len(before) / len(body))
    assert sorted(ctx.meta["depths"]) == sorted(round(d, 4) for d in raw)
    assert max(raw) > 0 and any(round(d, 4) != round(d, 5) for d in raw)  # the 4 decimals are visible here


def test_essay_file_is_read_as_utf8_whatever_the_locale(monkeypatch, tmp_path):
    """RULER's data files are UTF-8: an essay with non-ASCII text reads the same under the C locale (whose default
    text encoding is ASCII)."""
    write_essay(tmp_path, "")
    path = tmp_path / "ruler" / "PaulGrahamEssays.json"
    path.write_text(
        json.dumps({"text": "Caf\u00e9 na\u00efve r\u00e9sum\u00e9."}, ensure_ascii=False), encoding="utf-8"
    )
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path))
    saved = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, "C")
        essay = ruler_tasks.make_task("ruler", "niah_single_2", SEED, 4096).essay
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)
    assert essay.words == ["Caf\u00e9", "na\u00efve", "r\u00e9sum\u00e9."]


@pytest.mark.parametrize(
    ("length", "example", "repeats"), [(1024, (3, 1), (6, 1)), (4095, (3, 1), (6, 1)), (4096, (10, 3), (30, 3))]
)
def test_cwe_word_counts_follow_rulers_two_settings(length, example, repeats):
    """RULER's cwe below 4096 tokens: a 20-word example (10 words 3 times, 10 once) and the item's 10 common words
    6 times, the rest once; from 4096 on: 40 example words (10 x 10, 30 x 3), the common words 30 times, the rest 3.
    ``meta`` records the common words (the answer) and the two counts."""
    gen = ruler_tasks.make_task("ruler", "cwe", SEED, length)
    ctx = gen.build(5, 40)
    example_text = ctx.instruction.split("ones that appear most often.\n", 1)[1].split("\nQuestion: ")[0]
    ex_listed = numbered(example_text)
    ex_counts = sorted(ex_listed.count(w) for w in set(ex_listed))
    ex_total = 40 if length >= 4096 else 20
    assert ex_counts == [example[1]] * (ex_total - 10) + [example[0]] * 10
    listed = numbered(ctx.body)
    counts = {w: listed.count(w) for w in set(listed)}
    assert len(counts) == 40 and ctx.meta["repeats"] == list(repeats)
    assert sorted(ctx.meta["common"]) == sorted(w for w, c in counts.items() if c == repeats[0])
    assert len(ctx.meta["common"]) == 10 and list(ctx.questions[0].references) == ctx.meta["common"]
    assert all(c == repeats[1] for w, c in counts.items() if w not in ctx.meta["common"])


def replay_part(rng: random.Random, kind: str) -> str:
    """One needle key or value as RULER draws it (see :func:`test_needle_part_kinds`)."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    keys = niah_keys()
    return keys[rng.randrange(len(keys))]


@pytest.mark.parametrize(
    "task", ["niah_multikey_1", "niah_multiquery", "niah_multivalue", "niah_single_3", "niah_multikey_3"]
)
def test_niah_layout_replays_rulers_draws(task):
    """RULER's niah.py, replayed from the item's RNG: keys with their values, the needles shuffled by
    ``Random(seed)``, the queried keys, then the haystack: an essay's first ``n`` words cut before sentence
    ``int(len(sentences) * (depth / 100))`` for depths sampled from ``DEPTHS``, a needle after each cut; or
    ``n`` distractor needles with the needles inserted at sampled line indices, highest first."""
    cfg, n, item = NIAH_CONFIGS[task], 160, 2
    words = re.sub(r"\s+", " ", ESSAY).split(" ")
    essay = ruler_tasks._Essay(words) if cfg.haystack == "essay" else None
    ctx = ruler_tasks._Niah("ruler", task, SEED, 4096, essay).build(item, n)
    rng = item_rng(task, item)
    keys, values, needles = [], [], []
    for _ in range(cfg.num_k):
        keys.append(replay_part(rng, cfg.type_k))
        values.append([replay_part(rng, cfg.type_v) for _ in range(cfg.num_v)])
        needles += [f"One of the special magic {cfg.type_v} for {keys[-1]} is: {v}." for v in values[-1]]
    random.Random(SEED).shuffle(needles)
    picked = rng.sample(range(cfg.num_k), cfg.num_q)
    if cfg.haystack == "essay":
        sentences = split_sentences(" ".join(words[:n]).strip())
        depths = rng.sample(list(DEPTHS), len(needles))
        cuts = [0, *sorted(int(len(sentences) * (d / 100)) for d in depths), len(sentences)]
        assert len(set(cuts[1:-1])) == len(needles)  # each needle at its own depth of a many-sentence essay
        pieces = []
        for i, needle in enumerate([*needles, None]):
            pieces.append(" ".join(sentences[cuts[i] : cuts[i + 1]]))
            if needle is not None:
                pieces.append(needle)
        body = " ".join(pieces)
    else:
        lines = [
            f"One of the special magic {cfg.type_v} for {replay_part(rng, cfg.type_k)} is: "
            f"{replay_part(rng, cfg.type_v)}."
            for _ in range(n)
        ]
        for index, needle in zip(sorted(rng.sample(range(n), len(needles)), reverse=True), needles, strict=True):
            lines.insert(index, needle)
        body = "\n".join(lines)
    assert ctx.body == body
    assert ctx.meta["keys"] == keys and ctx.meta["values"] == values
    assert ctx.meta["queries"] == [keys[i] for i in picked]
    assert ctx.questions[0].references == tuple(v for i in picked for v in values[i])


def test_needle_depths_are_rulers_rounded_linspace():
    """RULER's depths are ``np.round(np.linspace(0, 100, 40))``, computed here by numpy apart from kvbench's
    table (which the essay replay test also reads, so it cannot check it): rounded, not truncated (truncation
    gives 2 for 2.56, 5 for 5.13, …)."""
    import numpy as np

    want = tuple(int(d) for d in np.round(np.linspace(0, 100, 40)))
    assert DEPTHS == want
    assert DEPTHS[1:4] == (3, 5, 8) and DEPTHS[-1] == 100
