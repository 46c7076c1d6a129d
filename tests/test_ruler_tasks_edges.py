"""Edges of RULER's task generators (:mod:`kvbench.tasks.ruler_tasks`) driven directly, as ``per_item`` drives them.

The generators' ``build(item, n)`` draws item ``item`` from ``Random(f"{seed}:{task}:{item}")`` (RULER's draw
order, replayed here by hand); vt's ``prepare`` sizes its one-shot example to the largest that fits 500 raw-text
tokens, checked with a tokenizer whose count of the example is known exactly.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import string
import uuid

import pytest

from kvbench.errors import KvbenchError, MissingDataError
from kvbench.tasks import Context, ruler_tasks
from kvbench.tasks.ruler_data import niah_keys, split_sentences

from .test_ruler import NOISE, TASKS, VT_TEMPLATE, data_dir, numbered, resolve  # noqa: F401 (data_dir: fixture)

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
    expected = re.escape(f'RULER data file {essay}: expected {{"text": "<non-empty essay text>"}}')
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
